"""benchmarks/graded_task_base.py's per-level statistics over an evaluation's samples (issue 50, item 1): the
format-valid rate read from each verifier's reasons, and pass@1's two standard errors, on a written samples.parquet."""
from helpers import benchmark_module


def test_format_valid_reads_each_verifiers_reasons(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    gtb = benchmark_module("graded_task_base")
    # l1: two problems x 2 samples, one with no readable answer -> format-valid 3/4; pass@1 2/4 = 0.5, binomial SE
    # sqrt(0.5 * 0.5 / 4) = 0.25, both problems at 0.5 so the problems' SE is 0. l2: a truncated box and an
    # expression where a number was asked for (answer_kind=number): neither readable
    rows = [{"level": "l1", "reasons": ["correct (numeric)", "not equal (numeric)"], "correct": [True, False]},
            {"level": "l1", "reasons": ["no answer found in the response", "correct (numeric)"],
             "correct": [False, True]},
            {"level": "l2", "reasons": ["the final \\boxed{ never closes (a truncated response)",
                                        "not a number: the answer is an expression"], "correct": [False, False]}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "samples.parquet")
    stats = gtb.sample_stats(tmp_path, gtb.FORMAT_INVALID["math"])
    assert stats["l1"]["format_valid"] == 0.75 and stats["l2"]["format_valid"] == 0.0
    assert stats["l1"]["pass@1_se_binomial"] == 0.25 and stats["l1"]["pass@1_se_problems"] == 0.0
    # countdown's reasons are its verifier's codes: "no answer ..." is not one of them, so it counts as readable there
    assert gtb.sample_stats(tmp_path)["l1"]["format_valid"] == 1.0
