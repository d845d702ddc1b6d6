"""``reasonrl/bench/mps_probe.py``: the MPS probe's output read into records, checked against the thirtieth session's
H100 output (benchmarks/results/s30_mps_priority_probe.txt) read by eye."""
from paths import REPO

from reasonrl.bench.mps_probe import probe_records


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
