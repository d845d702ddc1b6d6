"""One prompt across steps in the run viewer: ``/api/prompt`` on a hand-written sample log (the samples of a prompt by
step, the default pair, a word diff derived by hand, HTML escaped), bad parameters, and the page in a real headless
Chromium (the session's one browser, driven over its DevTools pipe): from a sample of the samples browser,
a click on "this prompt across steps", then a pair picked with the radio buttons and diffed."""
from __future__ import annotations

import hashlib
import json
import urllib.error
from pathlib import Path
from typing import Iterator

import pytest
from chromium_cdp import Chromium
from view_serving import get_json as get, serving

from reasonrl.view.prompt_steps import word_diff
from reasonrl.view.runs import open_runs

P, Q = "What is 6*7? Answer in \\boxed{}.", "What is 2+6?"


def line(step: int, prompt: str, response: str, verdict: str, reward: float) -> str:
    return json.dumps({"step": step, "prompt": prompt, "response": response, "reward": reward, "verifier": "math",
                       "failed": verdict == "failed", "correct": None if verdict == "failed" else verdict == "correct",
                       "reason": "timeout" if verdict == "failed" else "checked", "data_source": "gsm8k",
                       "response_tokens": len(response.split())}) + "\n"


LOG = [  # index positions 0..5; a line of another version between them is skipped, not counted
    line(1, P, "I do not know", "wrong", 0.0),
    line(1, Q, "8", "correct", 1.0),
    '{"old": "row"}\n',
    line(2, P, "x < y so 6*7 = 41", "wrong", 0.0),
    line(2, P, "maybe 40", "failed", 0.0),
    line(3, P, "x < y hence 6*7 = 42 & done", "correct", 1.0),
    line(3, P, "x < y hence 6*7 = 42", "correct", 1.0),
]
P_KEY = hashlib.blake2b(P.encode(), digest_size=8).hexdigest()  # the key: 64 bits of BLAKE2b of the prompt's text


@pytest.fixture()
def served(tmp_path: Path) -> Iterator[str]:
    run = tmp_path / "run"
    run.mkdir()
    (run / "samples.jsonl").write_text("".join(LOG))
    with serving(open_runs([run])) as url:
        yield url


def error_of(url: str):
    with pytest.raises(urllib.error.HTTPError) as caught:
        get(url)
    return caught.value.code, json.loads(caught.value.read())["error"]


def test_word_diff_by_hand() -> None:
    # words and spaces are tokens: "so" -> "hence" and "41" -> "42 & done" are replaced, the rest is equal
    assert word_diff("x < y so 6*7 = 41", "x < y hence 6*7 = 42 & done") == [
        ("equal", "x < y "), ("del", "so"), ("ins", "hence"), ("equal", " 6*7 = "), ("del", "41"),
        ("ins", "42 & done")]
    assert word_diff("a b", "a b") == [("equal", "a b")] and word_diff("", "new") == [("ins", "new")]


def test_prompt_across_steps_api(served: str) -> None:
    row = get(f"{served}/api/samples?run=0&step=3&limit=1")["rows"][0]
    assert row["prompt_key"] == P_KEY and row["position"] == 4
    got = get(f"{served}/api/prompt?run=0&key={P_KEY}")
    assert got["prompt"] == P and got["samples"] == 5
    assert [(s["step"], [(x["position"], x["verdict"], x["reward"]) for x in s["samples"]]) for s in got["steps"]] == [
        (1, [(0, "wrong", 0.0)]), (2, [(2, "wrong", 0.0), (3, "failed", 0.0)]),
        (3, [(4, "correct", 1.0), (5, "correct", 1.0)])]
    pair = got["pair"]  # the first correct response (step 3) against the first of the step before (step 2)
    assert (pair["a"]["position"], pair["b"]["position"]) == (2, 4)
    assert pair["diff"] == [["equal", "x < y "], ["del", "so"], ["ins", "hence"], ["equal", " 6*7 = "],
                            ["del", "41"], ["ins", "42 & done"]]
    assert pair["diff_html"] == "x &lt; y <del>so</del><ins>hence</ins> 6*7 = <del>41</del><ins>42 &amp; done</ins>"
    chosen = get(f"{served}/api/prompt?run=0&key={P_KEY}&a=4&b=5")["pair"]
    assert chosen["diff_html"] == "x &lt; y hence 6*7 = 42<del> &amp; done</del>"
    single = get(f"{served}/api/prompt?run=0&key={hashlib.blake2b(Q.encode(), digest_size=8).hexdigest()}")
    assert single["samples"] == 1 and single["pair"] is None


def test_prompt_api_bad_parameters(served: str) -> None:
    code, message = error_of(f"{served}/api/prompt?run=0&key=zz")
    assert code == 400 and "key='zz'" in message
    code, message = error_of(f"{served}/api/prompt?run=0&key={'0' * 16}")
    assert code == 404 and "no sample of prompt 0000000000000000" in message
    code, message = error_of(f"{served}/api/prompt?run=0&key={P_KEY}&a=1&b=4")  # position 1 is the other prompt's
    assert code == 400 and "a='1'" in message
    code, message = error_of(f"{served}/api/prompt?run=3&key={P_KEY}")
    assert code == 404


# ---------------------------------------------------------------------- in a real browser
@pytest.mark.slow
def test_click_through_to_the_prompt_across_steps(chromium_browser: Chromium, served: str, tmp_path: Path) -> None:
    tab = chromium_browser.open(f"{served}/?step=3&verdict=correct#samples")
    try:
        tab.wait_ready()
        assert tab.eval("document.querySelectorAll('article.sample').length") == 2
        tab.click("article.sample a.across", navigates=True)
        tab.wait_ready()
        assert tab.eval("location.pathname + location.search") == f"/prompt?run=0&key={P_KEY}"
        assert tab.eval("document.getElementById('prompt-text').textContent") == P
        steps = tab.eval("[...document.querySelectorAll('#steps tr')].map((r) => r.querySelector('th').textContent + "
                         "': ' + [...r.querySelectorAll('.badge')].map((b) => b.textContent).join(' '))")
        assert steps == ["step 1: wrong", "step 2: wrong failed", "step 3: correct correct"]
        assert tab.eval("document.getElementById('diff').innerHTML") == (
            "x &lt; y <del>so</del><ins>hence</ins> 6*7 = <del>41</del><ins>42 &amp; done</ins>")
        tab.click("input[name=a][value='4']")
        tab.click("input[name=b][value='5']")
        tab.click("#diff-pair")
        tab.wait_ready()
        assert tab.eval("document.getElementById('diff').innerHTML") == "x &lt; y hence 6*7 = 42<del> &amp; done</del>"
        assert tab.eval("document.querySelector('#diff del').textContent") == " & done"
        assert tab.eval("location.search") == f"?run=0&key={P_KEY}&a=4&b=5"
    except BaseException:
        tab.screenshot(tmp_path / "prompt_page_failure.png")
        print(f"screenshot: {tmp_path / 'prompt_page_failure.png'}")
        raise
    finally:
        tab.close()
