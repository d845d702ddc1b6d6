// reasonrl view: one prompt across steps (/prompt?run=I&key=K[&a=P&b=P]). Lists every logged sample of the prompt
// by step (verdict, reward, length); two radio columns pick the pair to diff (a: before, b: after). The diff comes
// from the server as escaped HTML with <del>/<ins> spans (reasonrl/view/prompt_steps.py).
(function () {
  "use strict";
  const query = new URLSearchParams(location.search);

  const el = window.reasonrlView.el;  // static/dom.js

  function describe(s) {
    return `step ${s.step} · ${s.verdict} · reward ${s.reward === null ? "none" : s.reward} · ${s.length} tokens`;
  }

  function stepTable(data, pair) {
    const rows = data.steps.map((group) => el("tr", { "data-step": group.step },
      el("th", {}, "step " + group.step),
      el("td", {}, group.samples.map((s) => el("span", { class: "pick", "data-position": s.position },
        el("input", { type: "radio", name: "a", value: s.position, checked: pair && pair.a.position === s.position,
          title: "diff from this one (a)" }),
        el("input", { type: "radio", name: "b", value: s.position, checked: pair && pair.b.position === s.position,
          title: "diff to this one (b)" }),
        el("span", { class: "badge " + s.verdict }, s.verdict), ` ${s.reward === null ? "–" : s.reward}`)))));
    const button = el("button", { id: "diff-pair", type: "submit" }, "diff a → b");
    const form = el("form", { id: "pair-form" }, el("table", { id: "steps" },
      el("caption", {}, "each sample: verdict, reward; its left radio picks a (before), its right one b (after)"),
      rows),
      button);
    form.onsubmit = (e) => {
      e.preventDefault();
      const data = new FormData(form);
      if (data.get("a") === null || data.get("b") === null) return;
      query.set("a", data.get("a"));
      query.set("b", data.get("b"));
      history.replaceState(null, "", location.pathname + "?" + query);
      load();
    };
    return form;
  }

  async function load() {
    document.body.removeAttribute("data-ready");
    const response = await fetch("/api/prompt?" + query);
    const data = await response.json();
    if (!response.ok) throw new Error(data.error || response.statusText);
    document.getElementById("back").setAttribute("href", "/?run=" + (query.get("run") || 0) + "#samples");
    document.getElementById("prompt-text").textContent = data.prompt || "";
    document.getElementById("step-table").replaceChildren(stepTable(data, data.pair));
    const label = document.getElementById("pair-label"), diff = document.getElementById("diff");
    if (data.pair) {
      label.textContent = `a: ${describe(data.pair.a)} → b: ${describe(data.pair.b)}`;
      diff.innerHTML = data.pair.diff_html;  // escaped on the server; only <del>/<ins> are markup
    } else {
      label.textContent = "";
      diff.textContent = "one sample of this prompt: nothing to compare";
    }
    const progress = data.indexing;
    const indexing = progress.building ? ` · indexing ${progress.lines_done} of ${progress.lines_total} rows` : "";
    document.getElementById("status").textContent = `${data.samples} samples in ${data.steps.length} steps` + indexing;
    document.body.setAttribute("data-ready", "1");
  }

  load().catch((err) => { document.getElementById("status").textContent = "error: " + err.message; });
})();
