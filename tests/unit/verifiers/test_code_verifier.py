"""The code verifier: program extraction, scoring modes, MBPP and HumanEval reference solutions on both backends."""
from __future__ import annotations

import concurrent.futures as cf
import json
import multiprocessing
import pickle

import pytest
from components import bwrap_ready, docker_ready, needs, needs_bwrap, needs_docker

from reasonrl.datasets import humaneval, mbpp
from reasonrl.verifiers import get_verifier
from reasonrl.verifiers.code import extract_program, parse_ground_truth

BACKENDS = [
    pytest.param("bwrap", marks=needs_bwrap()),
    pytest.param("docker", marks=needs_docker()),
]
ADD_TESTS = {"tests": ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(0, 0) == 0"], "test_imports": []}


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```\nDone."


@pytest.fixture(scope="module")
def mbpp_rows(data_dir):
    return mbpp.build_rows("test", data_dir) + mbpp.build_rows("train", data_dir)


@pytest.fixture(scope="module")
def mbpp_reference(data_dir):
    with open(data_dir / "mbpp_sanitized.jsonl") as f:
        return {ex["task_id"]: ex["code"] for ex in map(json.loads, f)}


@pytest.fixture(scope="module")
def humaneval_data():
    import gzip

    with humaneval.data_file().open("rb") as raw, gzip.open(raw, "rt") as f:
        problems = [json.loads(line) for line in f]
    return problems, humaneval.build_rows("test")


# --- no sandbox needed ------------------------------------------------------------------------------------------

def test_extracts_the_last_block_that_defines_the_entry_point():
    response = ("```python\ndef add(a, b):\n    return 0\n```\nBetter:\n```python\ndef add(a, b):\n    return a + b\n```\n"
                "Usage:\n```python\nprint(add(1, 2))\n```")
    assert extract_program(response, {"add"}) == "def add(a, b):\n    return a + b"


def test_extraction_fallbacks():
    assert extract_program("```bash\nls\n```\n```py\nx = 1\n```", {"f"}) == "x = 1"  # no block defines f: last Python one
    assert extract_program("def f():\n    return 1\n", {"f"}) == "def f():\n    return 1\n"  # bare code that parses
    assert extract_program("```python\ndef f():\n    return 2", {"f"}) == "def f():\n    return 2"  # cut-off fence
    assert extract_program("The answer is 42.", {"f"}) is None


def test_ground_truth_forms():
    assert parse_ground_truth(json.dumps(ADD_TESTS))["kind"] == "asserts"
    assert parse_ground_truth(ADD_TESTS)["entry_points"] == {"add"}
    he = parse_ground_truth({"test": "def check(candidate): pass", "entry_point": "g"})
    assert he["kind"] == "check" and he["tests"] == ["def check(candidate): pass"]
    with pytest.raises(ValueError):
        parse_ground_truth({"neither": 1})


def test_bad_inputs_score_zero_with_a_reason():
    v = get_verifier("code", sandbox="subprocess")  # none of these reaches a sandbox
    assert v.verify("no code here", ADD_TESTS).info["reason"] == "no code found in the response"
    res = v.verify(fenced("def add(a, b) return a"), ADD_TESTS)
    assert res.score == 0 and res.info["reason"] == "syntax error"
    assert v.verify(fenced("def add(a, b): return a + b"), {"oops": 1}).info["reason"] == "bad ground truth"
    assert v.verify(None, ADD_TESTS).score == 0  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        get_verifier("code", score_mode="most")


def test_options_are_picklable():
    v = get_verifier("code", sandbox="bwrap", score_mode="all", timeout_s=5)
    clone = pickle.loads(pickle.dumps(v))
    assert clone.options == v.options and clone.score_mode == "all"


def test_recipes_follow_the_schema(mbpp_rows, humaneval_data):
    from reasonrl.datasets.common import check_row

    _, he_rows = humaneval_data
    # 427 sanitized problems: 257 with task_id in 11..510 (test), 170 others (train); HumanEval has 164
    assert len(mbpp_rows) == 427 and sum(r["extra_info"]["split"] == "test" for r in mbpp_rows) == 257
    assert len(he_rows) == 164
    for row in mbpp_rows[:3] + he_rows[:3]:
        check_row(row, "row")
        assert row["verifier"] == "code" and row["ability"] == "code"
    assert mbpp_rows[0]["extra_info"] == {"split": "test", "index": 0, "task_id": 11}
    assert set(mbpp_rows[0]["reward_model"]["ground_truth"]) == {"tests", "test_imports"}
    assert he_rows[0]["extra_info"]["task_id"] == "HumanEval/0"
    assert {"test", "entry_point"} <= set(he_rows[0]["reward_model"]["ground_truth"])
    with pytest.raises(ValueError):
        humaneval.build_rows("train")


def test_ground_truth_survives_parquet(tmp_path, mbpp_rows, mbpp_reference, humaneval_data):
    from reasonrl.datasets.common import read_rows, write_parquet

    problems, he_rows = humaneval_data
    mbpp_back = read_rows(str(write_parquet(mbpp_rows[:5], tmp_path / "mbpp.parquet")))
    he_back = read_rows(str(write_parquet(he_rows[:5], tmp_path / "he.parquet")))
    assert [r["reward_model"] for r in mbpp_back] == [r["reward_model"] for r in mbpp_rows[:5]]
    assert [r["reward_model"] for r in he_back] == [r["reward_model"] for r in he_rows[:5]]
    v = get_verifier("code", sandbox="subprocess")  # trusted reference code: the plain backend is enough here
    assert v.verify(fenced(mbpp_reference[11]), mbpp_back[0]["reward_model"]["ground_truth"]).score == 1.0
    canonical = problems[0]["prompt"] + problems[0]["canonical_solution"]
    assert v.verify(fenced(canonical), he_back[0]["reward_model"]["ground_truth"]).score == 1.0


# --- on each backend --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_scoring_modes_and_failure_info(backend):
    wrong = fenced("def add(a, b):\n    return a * 2")  # add(1,2)=2 wrong; add(2,2)=4 and add(0,0)=0 right
    frac = get_verifier("code", sandbox=backend).verify(wrong, ADD_TESTS)
    assert frac.score == pytest.approx(2 / 3) and not frac.correct  # 2 of 3 tests pass
    assert frac.info["failed"][0]["index"] == 0
    assert "assert add(1, 2) == 3" in frac.info["reason"]
    strict = get_verifier("code", sandbox=backend, score_mode="all").verify(wrong, ADD_TESTS)
    assert strict.score == 0.0
    right = get_verifier("code", sandbox=backend, score_mode="all").verify(fenced("def add(a, b):\n    return a + b"),
                                                                             json.dumps(ADD_TESTS))
    assert right.score == 1.0 and right.correct and right.info["passed"] == 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_exceptions_and_load_errors_are_reported(backend):
    v = get_verifier("code", sandbox=backend)
    res = v.verify(fenced("def add(a, b):\n    raise ValueError('nope')"), ADD_TESTS)
    assert res.score == 0 and "ValueError: nope" in res.info["reason"]
    res = v.verify(fenced("import does_not_exist\ndef add(a, b):\n    return a + b"), ADD_TESTS)
    assert res.score == 0 and "ModuleNotFoundError" in res.info["reason"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_builtin_exception_the_test_expects_reaches_it_as_that_type(backend):
    # the judge re-raises the program's exception as the built-in type; a TypeError used to be swallowed by the
    # ``except TypeError`` around that re-raise and reach the test as CandidateError instead
    tests = {"tests": ["assert add(1, 2) == 3"] + [
        f"try:\n    add({arg!r}, 1)\nexcept {name}:\n    pass\nelse:\n    raise AssertionError('no {name}')"
        for arg, name in (("type", "TypeError"), ("value", "ValueError"), ("key", "KeyError"))], "test_imports": []}
    program = ("def add(a, b):\n    if a == 'type':\n        raise TypeError('not a number')\n"
               "    if a == 'value':\n        raise ValueError('bad')\n    if a == 'key':\n        raise KeyError(a)\n"
               "    return a + b")
    v = get_verifier("code", sandbox=backend)
    res = v.verify(fenced(program), tests)
    assert res.score == 1.0 and res.correct, res.info
    # and a program raising the wrong type still fails that test: ValueError where TypeError is expected
    res = v.verify(fenced(program.replace("raise TypeError('not a number')", "raise ValueError('x')")), tests)
    assert res.score == pytest.approx(3 / 4) and res.info["failed"][0]["index"] == 1, res.info


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_program_stopped_by_the_harness_deadline_is_reported_timed_out(backend):
    v = get_verifier("code", sandbox=backend, timeout_s=3)
    looping = fenced("def add(a, b):\n    if a == 2:\n        while True:\n            pass\n    return a + b")
    res = v.verify(looping, ADD_TESTS)  # test 0 passes, test 1 loops until the harness deadline, test 2 is not run
    assert res.info["timed_out"] is True and res.info["reason"].startswith("test 1 failed: time limit"), res.info
    assert res.score == pytest.approx(1 / 3)
    res = v.verify(fenced("while True:\n    pass"), ADD_TESTS)  # at import
    assert res.info["timed_out"] is True and res.score == 0.0, res.info
    res = v.verify(fenced("def add(a, b):\n    return a - b"), ADD_TESTS)  # fails fast: no time limit involved
    assert res.info["timed_out"] is False and res.score == pytest.approx(1 / 3), res.info


@pytest.mark.parametrize("backend", BACKENDS)
def test_mbpp_reference_solutions_pass_and_mismatched_ones_fail(backend, mbpp_rows, mbpp_reference):
    v = get_verifier("code", sandbox=backend)
    sample = mbpp_rows[::60]  # 8 problems spread over both splits
    for row, other in zip(sample, sample[1:] + sample[:1]):
        gt = row["reward_model"]["ground_truth"]
        good = v.verify(fenced(mbpp_reference[row["extra_info"]["task_id"]]), gt)
        assert good.score == 1.0, (row["extra_info"], good.info)
        wrong = v.verify(fenced(mbpp_reference[other["extra_info"]["task_id"]]), gt)
        assert wrong.score == 0.0, (row["extra_info"], wrong.info)


@pytest.mark.parametrize("backend", BACKENDS)
def test_humaneval_reference_solutions_pass_and_wrong_ones_fail(backend, humaneval_data):
    problems, rows = humaneval_data
    v = get_verifier("code", sandbox=backend)
    for i in list(range(0, 164, 33)) + [32]:  # 32 (find_zero) needs the prompt's helper `poly`
        gt = rows[i]["reward_model"]["ground_truth"]
        full = problems[i]["prompt"] + problems[i]["canonical_solution"]
        assert v.verify(fenced(full), gt).score == 1.0, problems[i]["task_id"]
        stub = f"def {problems[i]['entry_point']}(*args):\n    return None"
        assert v.verify(fenced(stub), gt).score == 0.0, problems[i]["task_id"]
    # without the recipe's prefix the solution of HumanEval/32 alone lacks `poly`
    bare = {"test": problems[32]["test"], "entry_point": "find_zero"}
    solution_only = "def find_zero(xs):\n" + problems[32]["canonical_solution"]
    missing_helper = v.verify(fenced(solution_only), bare)
    assert missing_helper.score == 0.0 and "NameError" in missing_helper.info["reason"]  # poly is not defined
    assert v.verify(fenced(solution_only), rows[32]["reward_model"]["ground_truth"]).score == 1.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_verifier_works_in_a_spawned_worker_process(backend):
    v = get_verifier("code", sandbox=backend)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        results = pool.starmap(v.verify, [(fenced("def add(a, b):\n    return a + b"), ADD_TESTS)] * 2)
    assert [r.score for r in results] == [1.0, 1.0]


@pytest.mark.slow
@needs("a code sandbox (bwrap or Docker)", bwrap_ready()[0] or docker_ready()[0],
       f"bwrap: {bwrap_ready()[1]}; Docker: {docker_ready()[1]}")
def test_every_reference_solution_passes(mbpp_rows, mbpp_reference, humaneval_data):
    """All 427 MBPP + 164 HumanEval references on the default backend (about a minute on 2 cores)."""
    problems, he_rows = humaneval_data
    jobs = [(fenced(mbpp_reference[r["extra_info"]["task_id"]]), r["reward_model"]["ground_truth"]) for r in mbpp_rows]
    jobs += [(fenced(p["prompt"] + p["canonical_solution"]), r["reward_model"]["ground_truth"])
             for p, r in zip(problems, he_rows)]
    v = get_verifier("code", timeout_s=20)
    with cf.ThreadPoolExecutor(4) as ex:
        results = list(ex.map(lambda job: v.verify(*job), jobs))
    failed = [(i, r.info.get("reason")) for i, r in enumerate(results) if r.score != 1.0]
    assert not failed


@pytest.mark.parametrize("backend", BACKENDS)
def test_through_the_verifier_pool(backend):
    from reasonrl.verifiers.pool import VerifierPool

    good = fenced("def add(a, b):\n    return a + b")
    items = [("code", good, ADD_TESTS), ("code", fenced("def add(a, b):\n    return a * 2"), ADD_TESTS),
             ("code", fenced("while True:\n    pass"), ADD_TESTS), ("code", fenced("import os\nos._exit(0)"), ADD_TESTS),
             ("code", good, ADD_TESTS)]
    with VerifierPool(workers=2, timeout_s=30, verifier_options={"code": {"sandbox": backend, "timeout_s": 3}}) as pool:
        first = pool.verify_batch(items)
        again = pool.verify_batch(items[:1])
    # in input order: right (3/3), a*2 (2/3: add(2,2) and add(0,0) hold), endless loop and early exit (0)
    assert [r.score for r in first] == [1.0, pytest.approx(2 / 3), 0.0, 0.0, 1.0]
    assert first[0].info["sandbox"] == backend
    assert again[0].score == 1.0


def test_future_imports_stay_first_after_the_prefix(humaneval_data):
    problems, rows = humaneval_data
    program = "from __future__ import annotations\n" + problems[0]["prompt"] + problems[0]["canonical_solution"]
    res = get_verifier("code", sandbox="subprocess").verify(fenced(program), rows[0]["reward_model"]["ground_truth"])
    assert res.score == 1.0, res.info
