"""``reasonrl/bench/mps_probe.py``: the MPS probe's output read into records, checked against the thirtieth session's
H100 output (benchmarks/results/s30_mps_priority_probe.txt) read by eye."""
from paths import REPO

from reasonrl.bench.mps_probe import overlap_shares, probe_records


def test_the_h100_probe_reads_into_one_record_per_timed_client():
    lines = (REPO / "benchmarks" / "results" / "s30_mps_priority_probe.txt").read_text().splitlines()
    read = probe_records(lines)
    seconds = {label: r["seconds"] for label, r in read["probes"].items()}
    assert seconds == {"A=solo": 1.222, "A=beside_idle_low": 1.136, "A=beside_busy_low": 1.383,
                       "A=beside_busy_normal": 2.168, "CUDA_MPS_CLIENT_PRIORITY=1": 5.336,
                       "A=beside_busy_sm60": 2.182, "A=after_quit": 1.146}
    assert {(r["kernels"], r["count"]) for r in read["probes"].values()} == {("matmuls", 400)}
    assert read["errors"] == []


def test_decode_lines_keep_their_bandwidth_and_failures_are_kept():
    read = probe_records(["== 9 decode beside busy normal",
                          "A=decode_beside_busy_normal 5000 decode-like steps s 4.5 weight GB/s 596",
                          "A=low_beside_busy_normal CUDA_MPS_CLIENT_PRIORITY=1 400 matmuls s 5.3",
                          "RuntimeError: ... Error 805: MPS client failed to connect to the MPS control daemon"])
    assert read["probes"] == {
        "A=decode_beside_busy_normal": {"kernels": "decode-like steps", "count": 5000, "seconds": 4.5,
                                        "weight_gb_per_s": 596},
        "A=low_beside_busy_normal CUDA_MPS_CLIENT_PRIORITY=1": {"kernels": "matmuls", "count": 400, "seconds": 5.3}}
    assert read["errors"] == ["RuntimeError: ... Error 805: MPS client failed to connect to the MPS control daemon"]


def test_overlap_shares_by_hand():
    """Compute alone 1 s, decode alone 2 s. Under sm60 the compute client takes 2 s beside a busy decode (0.5 of its
    speed) and the decode 2.5 s beside it (0.8): 1.3. With the ``A=`` prefix the normal pair reads the same way:
    1 / 1.25 = 0.8 and 2 / 8 = 0.25, 1.05 (and the label led by the client's variables is read by its last word).
    A limit measured one way only (sm40) has no entry."""
    seconds = {"A=solo": 1.0, "A=decode_solo": 2.0, "decode_beside_busy_sm60": 2.5,
               "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=60 A=sm60_beside_busy_decode": 2.0,
               "normal_beside_busy_decode": 1.25, "A=decode_beside_busy_normal": 8.0, "sm40_beside_busy_decode": 4.0}
    shares = overlap_shares({label: {"seconds": s} for label, s in seconds.items()})
    assert shares == {"sm60": {"compute": 0.5, "decode": 0.8, "sum": 1.3},
                      "normal": {"compute": 0.8, "decode": 0.25, "sum": 1.05}}
    assert overlap_shares({"sm60_beside_busy_decode": {"seconds": 2.0}}) == {}  # nothing alone to compare with
