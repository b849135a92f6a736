// polarproxy view: the front end. Plain JS, no build step, nothing fetched but this server's /api/
// (or, in an exported report, the payloads inlined in #polarproxy-data). Every value from the store is
// put into the page with textContent or attributes, never parsed as HTML.
"use strict";
(function () {
  const DATA_EL = document.getElementById("polarproxy-data");
  const REPORT = DATA_EL ? JSON.parse(DATA_EL.textContent) : null;
  const main = document.getElementById("main");
  const BLOCK = 1000; // tokens per lazily rendered block
  const EAGER_BLOCKS = 2; // rendered at once: the first screen
  const MAX_ROWS = 500; // episode rows shown at once
  let INFO = null;

  // ---- data -------------------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(message, hint, status) {
      super(message);
      this.hint = hint;
      this.status = status;
    }
  }

  async function api(path) {
    if (REPORT) {
      if (Object.prototype.hasOwnProperty.call(REPORT, path)) return REPORT[path];
      throw new ApiError(
        "This report does not include " + path + ".",
        "A report holds one episode; open the store with `polarproxy view` for the rest.",
        404,
      );
    }
    const r = await fetch(path, { headers: { Accept: "application/json" } });
    let body = null;
    try {
      body = await r.json();
    } catch (e) {
      body = { error: r.status + " " + r.statusText };
    }
    if (!r.ok) throw new ApiError(body.error || r.statusText, body.hint, r.status);
    return body;
  }

  // ---- DOM helpers ------------------------------------------------------------------------------------

  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    setAttrs(el, attrs);
    append(el, kids);
    return el;
  }

  const SVGNS = "http://www.w3.org/2000/svg";
  function s(tag, attrs, ...kids) {
    const el = document.createElementNS(SVGNS, tag);
    setAttrs(el, attrs);
    append(el, kids);
    return el;
  }

  function setAttrs(el, attrs) {
    if (!attrs) return;
    for (const [k, v] of Object.entries(attrs)) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.setAttribute("class", v);
      else if (k === "text") el.textContent = v;
      else if (k === "dataset") Object.assign(el.dataset, v);
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? "" : String(v));
    }
  }

  function append(el, kids) {
    for (const kid of kids.flat(Infinity)) {
      if (kid === null || kid === undefined || kid === false) continue;
      el.append(kid instanceof Node ? kid : String(kid));
    }
  }

  function link(href, text, attrs) {
    return h("a", Object.assign({ href: href }, attrs || {}), text);
  }

  function dash(v) {
    return v === null || v === undefined || v === "" ? "-" : String(v);
  }

  function num(v, digits) {
    if (v === null || v === undefined) return "-";
    if (typeof v !== "number") return String(v);
    if (digits === undefined) return Number.isInteger(v) ? String(v) : String(+v.toPrecision(6));
    return v.toFixed(digits);
  }

  function ms(v) {
    return v === null || v === undefined ? "-" : v.toFixed(0) + " ms";
  }

  function pad(n) {
    return String(n).padStart(2, "0");
  }

  function when(ts) {
    if (!ts) return "-";
    const d = new Date(ts * 1000);
    return (
      d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
      pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds())
    );
  }

  function status(v) {
    return h("span", { class: "status status-" + v }, v);
  }

  function facts(pairs) {
    const dl = h("dl", { class: "facts" });
    for (const [k, v] of pairs) {
      if (v === undefined) continue;
      dl.append(h("dt", null, k), h("dd", null, v === null ? "-" : v));
    }
    return dl;
  }

  function table(headers, rows, attrs) {
    const head = h("tr", null, headers.map((x) => h("th", { class: x.num ? "num" : null }, x.label || x)));
    const body = h("tbody");
    for (const r of rows) {
      body.append(h("tr", r.attrs || null, r.cells.map((c, i) => h("td", { class: headers[i].num ? "num" : null }, c))));
    }
    return h("table", Object.assign({ class: "grid" }, attrs || {}), h("thead", null, head), body);
  }

  function errorBox(e) {
    return h(
      "div",
      { class: "error", role: "alert" },
      h("div", null, h("b", null, "Error: "), e.message || String(e)),
      e.hint ? h("div", { class: "hint" }, e.hint) : null,
    );
  }

  function renderLabel(c, seqOf) {
    if (c.render_mode === "extended") {
      const seq = seqOf[c.extended_from];
      return "extends #" + (seq === undefined ? "?" : seq);
    }
    return c.render_mode;
  }

  // ---- tokens -----------------------------------------------------------------------------------------

  function unsure(lp) {
    // 0 (the model was sure: p = 1) .. 9 (p close to 0)
    const p = Math.exp(lp);
    return Math.min(9, Math.max(0, Math.floor((1 - p) * 10)));
  }

  function tokenLabel(text, id) {
    if (!text) return "[" + id + "]";
    const t = text[String(id)];
    if (t === undefined) return "[" + id + "]";
    if (t === "") return "∅";
    return t.replace(/\n/g, "↵\n").replace(/\t/g, "→\t");
  }

  // A virtualised token view: blocks of BLOCK tokens, the first EAGER_BLOCKS rendered at once, the others
  // when they come near the viewport (and emptied again when far from it), so a 100k-token trajectory
  // never holds 100k nodes. tok: {ids, mask, logprobs, text, spans: [[a, b]], spanLabels, marks: {i: cls}}.
  function tokenView(tok) {
    const n = tok.ids.length;
    const text = tok.text;
    const spans = tok.spans || [];
    const spanStart = new Map(spans.map((sp, k) => [sp[0], k]));
    const marks = tok.marks || {};
    const info = h("div", { class: "tokinfo" }, "Click a token to see its position, ID, text and logprob.");
    const hover = h("div", { class: "tokhover" }, " ");
    const gotoInput = h("input", { type: "number", min: 0, max: Math.max(0, n - 1), placeholder: "position" });
    const gotoForm = h(
      "form",
      { class: "goto", onsubmit: (e) => { e.preventDefault(); const i = parseInt(gotoInput.value, 10); if (i >= 0 && i < n) scrollToToken(i); } },
      "Go to token ", gotoInput, " ", h("button", { type: "submit" }, "go"),
    );
    const legend = h(
      "div",
      { class: "legend" },
      h("span", { class: "t m0" }, "masked (prompt)"),
      h("span", { class: "t m1 u0" }, "trainable, p≈1"),
      h("span", { class: "t m1 u5" }, "p≈0.5"),
      h("span", { class: "t m1 u9" }, "p≈0"),
      h("span", { class: "t m1 unk" }, "trainable, no logprob"),
      spans.length ? h("span", null, h("span", { class: "t m1 u0 cs" }, "▏"), " a call's output starts") : null,
      gotoForm,
    );
    const box = h("div", { class: "tokens", dataset: { count: String(n) } });
    const blocks = [];
    const width = Math.max(400, (document.documentElement.clientWidth || 1200) - 60);
    for (let b = 0; b * BLOCK < n; b++) {
      const el = h("div", { class: "tblock", dataset: { b: String(b), state: "off" } });
      el.style.minHeight = estimateHeight(b) + "px";
      blocks.push(el);
      box.append(el);
    }

    function estimateHeight(b) {
      let chars = 0;
      let lines = 1;
      const hi = Math.min(n, (b + 1) * BLOCK);
      for (let i = b * BLOCK; i < hi; i++) {
        const id = tok.ids[i];
        const t = text ? text[String(id)] : undefined;
        if (t === undefined) chars += String(id).length + 2;
        else {
          chars += t.length + 0.2;
          if (t.indexOf("\n") >= 0) lines += 1;
        }
      }
      return Math.ceil((chars * 7.8) / width + lines) * 20;
    }

    function tokenSpan(i) {
      const span = document.createElement("span");
      const m = tok.mask[i];
      let cls = "t m" + m;
      if (m) {
        const lp = tok.logprobs[i];
        cls += lp === null || lp === undefined ? " unk" : " u" + unsure(lp);
      }
      if (spanStart.has(i)) cls += " cs";
      if (marks[i]) cls += " " + marks[i];
      if (i === selected) cls += " sel";
      span.className = cls;
      span.dataset.i = String(i);
      span.dataset.id = String(tok.ids[i]);
      span.textContent = tokenLabel(text, tok.ids[i]);
      return span;
    }

    function fill(b) {
      const el = blocks[b];
      if (!el || el.dataset.state === "on") return;
      const frag = document.createDocumentFragment();
      const hi = Math.min(n, (b + 1) * BLOCK);
      for (let i = b * BLOCK; i < hi; i++) frag.append(tokenSpan(i));
      el.replaceChildren(frag);
      el.style.minHeight = "";
      el.style.height = "";
      el.dataset.state = "on";
    }

    function empty(b) {
      const el = blocks[b];
      if (el.dataset.state !== "on") return;
      el.style.height = el.offsetHeight + "px";
      el.replaceChildren();
      el.dataset.state = "off";
    }

    function spanOf(i) {
      for (let k = 0; k < spans.length; k++) if (i >= spans[k][0] && i < spans[k][1]) return k;
      return -1;
    }

    function describe(i) {
      const id = tok.ids[i];
      const m = tok.mask[i];
      const lp = tok.logprobs[i];
      const parts = ["#" + i, "ID " + id];
      const t = text ? text[String(id)] : undefined;
      parts.push(t === undefined ? "(no text)" : "text " + JSON.stringify(t));
      parts.push(m ? "trainable" : "masked");
      if (lp !== null && lp !== undefined) parts.push("logprob " + lp.toFixed(4) + " (p " + Math.exp(lp).toFixed(3) + ")");
      else parts.push("logprob -");
      const k = spanOf(i);
      if (k >= 0 && tok.spanLabels) parts.push("output of " + tok.spanLabels[k]);
      return parts.join("   ");
    }

    let selected = -1;
    function select(i) {
      const prev = box.querySelector(".t.sel");
      if (prev) prev.classList.remove("sel");
      selected = i;
      const el = box.querySelector('.t[data-i="' + i + '"]');
      if (el) el.classList.add("sel");
      info.textContent = describe(i);
      info.dataset.i = String(i);
    }

    function scrollToToken(i) {
      const b = Math.floor(i / BLOCK);
      fill(b);
      const el = blocks[b].querySelector('.t[data-i="' + i + '"]');
      if (el) el.scrollIntoView({ block: "center" });
      select(i);
    }

    box.addEventListener("click", (e) => {
      const t = e.target.closest(".t");
      if (t) select(parseInt(t.dataset.i, 10));
    });
    box.addEventListener("mouseover", (e) => {
      const t = e.target.closest(".t");
      if (t) hover.textContent = describe(parseInt(t.dataset.i, 10));
    });

    for (let b = 0; b < Math.min(EAGER_BLOCKS, blocks.length); b++) fill(b);
    if ("IntersectionObserver" in window && blocks.length > EAGER_BLOCKS) {
      const io = new IntersectionObserver(
        (entries) => {
          for (const en of entries) {
            const b = parseInt(en.target.dataset.b, 10);
            if (en.isIntersecting) fill(b);
            else empty(b);
          }
        },
        { rootMargin: "1500px 0px" },
      );
      blocks.forEach((el) => io.observe(el));
    } else {
      blocks.forEach((el, b) => fill(b));
    }
    const node = h("div", { class: "tokview" }, h("div", { class: "tokbar" }, legend, info, hover), box);
    return { node: node, scrollToToken: scrollToToken, select: select };
  }

  // A short strip of tokens (the audit's windows), all rendered.
  // firstDiff: the first differing position; changed: how many tokens from it on differ (the middle span
  // left when the common prefix and the common suffix are taken off; the rest is shifted, not changed).
  function tokenStrip(ids, text, start, firstDiff, changed, infoEl) {
    const box = h("div", { class: "tokens" });
    ids.forEach((id, k) => {
      const pos = start + k;
      let cls = "t m0";
      if (pos === firstDiff) cls += " diff";
      if (pos >= firstDiff && pos < firstDiff + changed) cls += " after";
      const span = h("span", { class: cls, dataset: { i: String(pos), id: String(id) } }, tokenLabel(text, id));
      box.append(span);
    });
    box.addEventListener("click", (e) => {
      const t = e.target.closest(".t");
      if (!t) return;
      const id = t.dataset.id;
      const tx = text ? text[id] : undefined;
      infoEl.textContent = "#" + t.dataset.i + "   ID " + id + "   text " + (tx === undefined ? "-" : JSON.stringify(tx));
    });
    return box;
  }

  // ---- charts -----------------------------------------------------------------------------------------

  function lineChart(title, points, opts) {
    const W = 480, H = 220, L = 56, R = 12, T = 26, B = 30;
    const svg = s("svg", { class: "chart", width: W, height: H, viewBox: "0 0 " + W + " " + H, dataset: { metric: opts.key, points: String(points.length) }, role: "img", "aria-label": title });
    svg.append(s("text", { class: "title", x: L, y: 16 }, title));
    if (!points.length) {
      svg.append(s("text", { x: L, y: H / 2 }, "no values"));
      return svg;
    }
    const xs = points.map((p) => p[0]);
    const ys = points.map((p) => p[1]);
    let x0 = Math.min(...xs), x1 = Math.max(...xs);
    let y0 = Math.min(...ys), y1 = Math.max(...ys);
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    if (y0 === y1) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
    const px = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
    const py = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - T - B);
    for (let k = 0; k <= 4; k++) {
      const y = y0 + ((y1 - y0) * k) / 4;
      svg.append(s("line", { class: "grid", x1: L, x2: W - R, y1: py(y), y2: py(y) }));
      svg.append(s("text", { x: L - 6, y: py(y) + 4, "text-anchor": "end" }, num(+y.toPrecision(3))));
    }
    svg.append(s("line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B }));
    svg.append(s("line", { class: "axis", x1: L, x2: L, y1: T, y2: H - B }));
    svg.append(s("text", { x: L, y: H - B + 16, "text-anchor": "start" }, "step " + num(xs[0])));
    svg.append(s("text", { x: W - R, y: H - B + 16, "text-anchor": "end" }, "step " + num(xs[xs.length - 1])));
    // gaps where a step has no value: one polyline per run of steps with values
    let run = [];
    const runs = [run];
    opts.all.forEach((p) => {
      if (p[1] === null) { run = []; runs.push(run); } else run.push(p);
    });
    for (const r of runs) {
      if (r.length > 1) svg.append(s("polyline", { class: "line", points: r.map((p) => px(p[0]).toFixed(1) + "," + py(p[1]).toFixed(1)).join(" ") }));
    }
    if (points.length <= 200) {
      for (const p of points) svg.append(s("circle", { class: "pt", cx: px(p[0]), cy: py(p[1]), r: 2.2 }, s("title", null, "step " + p[0] + ": " + p[1])));
    }
    return svg;
  }

  function timeline(calls) {
    const timed = calls.filter((c) => c.started_at);
    if (!timed.length) return h("p", { class: "note" }, "No call times recorded.");
    const t0 = Math.min(...timed.map((c) => c.started_at));
    const end = (c) => (c.latency_ms !== null && c.latency_ms !== undefined ? c.started_at + c.latency_ms / 1000 : c.ended_at || c.started_at);
    const t1 = Math.max(...timed.map(end));
    const span = Math.max(t1 - t0, 1e-3);
    const W = 960, L = 48, R = 14, row = 16, T = 6;
    const H = T + timed.length * row + 22;
    const px = (t) => L + ((t - t0) / span) * (W - L - R);
    const svg = s("svg", { class: "timeline", width: W, height: H, viewBox: "0 0 " + W + " " + H, dataset: { calls: String(timed.length) }, role: "img", "aria-label": "call timeline" });
    timed.forEach((c, k) => {
      const y = T + k * row;
      const x = px(c.started_at);
      const w = Math.max(2, px(end(c)) - x);
      const tip = "#" + c.seq + " " + c.dialect + " " + c.status + "  latency " + ms(c.latency_ms) + "  ttft " + ms(c.ttft_ms) + "  " + c.prompt_tokens + " + " + c.output_tokens + " tokens";
      svg.append(s("text", { x: L - 6, y: y + 11, "text-anchor": "end" }, "#" + c.seq));
      svg.append(s("rect", { class: "bar-" + c.status, x: x, y: y + 2, width: w, height: row - 4, rx: 2 }, s("title", null, tip)));
      if (c.ttft_ms !== null && c.ttft_ms !== undefined) {
        const tx = px(c.started_at + c.ttft_ms / 1000);
        svg.append(s("line", { class: "ttft", x1: tx, x2: tx, y1: y + 1, y2: y + row - 1 }, s("title", null, "time to first token " + ms(c.ttft_ms))));
      }
    });
    const ya = T + timed.length * row + 4;
    svg.append(s("line", { class: "axis", x1: L, x2: W - R, y1: ya, y2: ya }));
    svg.append(s("text", { x: L, y: ya + 14 }, "0 s"));
    svg.append(s("text", { x: W - R, y: ya + 14, "text-anchor": "end" }, span.toFixed(span < 10 ? 2 : 0) + " s"));
    return svg;
  }

  // ---- views ------------------------------------------------------------------------------------------

  const listState = { sort: "started_at", desc: true, f: {} };

  async function viewList() {
    const data = await api("/api/episodes");
    const eps = data.episodes;
    const distinct = (key) => [...new Set(eps.map((e) => e[key]).filter((v) => v !== null && v !== undefined))].sort();
    const f = listState.f;
    const select = (key, label) => {
      const el = h("select", { name: key }, h("option", { value: "" }, "all"), distinct(key).map((v) => h("option", { value: v }, v)));
      el.value = f[key] || "";
      el.addEventListener("change", () => { f[key] = el.value; draw(); });
      return h("label", null, label, el);
    };
    const input = (key, label, type) => {
      const el = h("input", { name: key, type: type, step: type === "number" ? "any" : null });
      el.value = f[key] || "";
      el.addEventListener("input", () => { f[key] = el.value; draw(); });
      return h("label", null, label, el);
    };
    const filters = h(
      "form",
      { class: "filters", onsubmit: (e) => e.preventDefault() },
      select("status", "status"), select("task", "task"), select("group_id", "group"), select("harness", "harness"),
      input("min_reward", "reward ≥", "number"), input("max_reward", "reward ≤", "number"),
      input("since", "started after", "datetime-local"), input("until", "started before", "datetime-local"),
      input("q", "id or command contains", "search"),
      h("button", { type: "button", onclick: () => { listState.f = {}; route(); } }, "clear"),
    );
    const cols = [
      ["id", "id"], ["command", "command"], ["task", "task"], ["group_id", "group"], ["harness", "harness"],
      ["status", "status"], ["exit_code", "exit", true], ["calls", "calls", true], ["tokens", "tokens", true],
      ["reward", "reward", true], ["started_at", "started"],
    ];
    const headRow = h("tr");
    const ths = {};
    for (const [key, label, isNum] of cols) {
      const th = h("th", { class: "sortable" + (isNum ? " num" : ""), dataset: { key: key } }, label);
      th.addEventListener("click", () => {
        if (listState.sort === key) listState.desc = !listState.desc;
        else { listState.sort = key; listState.desc = key === "started_at"; }
        draw();
      });
      ths[key] = th;
      headRow.append(th);
    }
    const body = h("tbody");
    const count = h("p", { class: "count" });
    const tbl = h("table", { class: "grid", id: "episodes" }, h("thead", null, headRow), body);

    function keep(e) {
      if (f.status && e.status !== f.status) return false;
      if (f.task && e.task !== f.task) return false;
      if (f.group_id && e.group_id !== f.group_id) return false;
      if (f.harness && e.harness !== f.harness) return false;
      if (f.min_reward !== undefined && f.min_reward !== "" && !(e.reward !== null && e.reward >= +f.min_reward)) return false;
      if (f.max_reward !== undefined && f.max_reward !== "" && !(e.reward !== null && e.reward <= +f.max_reward)) return false;
      if (f.since && !(e.started_at * 1000 >= new Date(f.since).getTime())) return false;
      if (f.until && !(e.started_at * 1000 < new Date(f.until).getTime())) return false;
      if (f.q) {
        const q = f.q.toLowerCase();
        if (e.id.toLowerCase().indexOf(q) < 0 && e.command.join(" ").toLowerCase().indexOf(q) < 0) return false;
      }
      return true;
    }

    function cmp(a, b) {
      const k = listState.sort;
      let x = a[k], y = b[k];
      if (k === "command") { x = x.join(" "); y = y.join(" "); }
      if (x === null || x === undefined) return 1; // missing values last, either way
      if (y === null || y === undefined) return -1;
      const c = typeof x === "number" ? x - y : String(x).localeCompare(String(y));
      return listState.desc ? -c : c;
    }

    function draw() {
      const rows = eps.filter(keep).sort(cmp);
      for (const [key, th] of Object.entries(ths)) {
        th.classList.toggle("sorted-asc", key === listState.sort && !listState.desc);
        th.classList.toggle("sorted-desc", key === listState.sort && listState.desc);
      }
      const shown = rows.slice(0, MAX_ROWS);
      body.replaceChildren(
        ...shown.map((e) =>
          h(
            "tr",
            { dataset: { id: e.id } },
            h("td", null, link("#/episode/" + e.id, e.id, { class: "mono" })),
            h("td", { class: "mono" }, e.command.join(" ")),
            h("td", null, dash(e.task)),
            h("td", null, dash(e.group_id)),
            h("td", null, dash(e.harness)),
            h("td", null, status(e.status)),
            h("td", { class: "num" }, dash(e.exit_code)),
            h("td", { class: "num" }, String(e.calls)),
            h("td", { class: "num" }, String(e.tokens)),
            h("td", { class: "num" }, num(e.reward)),
            h("td", null, when(e.started_at)),
          ),
        ),
      );
      count.textContent =
        rows.length + " of " + eps.length + " episodes" +
        (rows.length > shown.length ? " (the first " + shown.length + " shown; narrow the filters)" : "") +
        (data.truncated ? "; the store holds more than these" : "");
      count.dataset.shown = String(rows.length);
    }
    draw();
    return h("div", null, h("h1", null, "Episodes"), filters, count, tbl);
  }

  // A grader's per-test results (rollout's SWE-bench grading): the tests that did not pass first.
  function gradingView(g) {
    const tests = Object.entries(g.tests || {});
    const passing = (s) => s === "PASSED" || s === "XFAIL";
    tests.sort((a, b) => Number(passing(a[1])) - Number(passing(b[1])));
    const passed = tests.filter(([, s]) => passing(s)).length;
    const verdict = g.resolved === true ? "resolved" : g.resolved === false ? "not resolved" : "";
    return h(
      "div",
      { id: "ep-grading" },
      h("h2", null, "Tests: " + passed + " of " + tests.length + " passed" + (verdict ? ", " + verdict : "")),
      h("p", { class: "note" }, "parser: " + (g.parser || "unknown")),
      table(["test", "status"], tests.map(([t, s]) => ({ cells: [h("code", null, t), h("span", { class: passing(s) ? "status-ok" : "status-failed" }, s)] }))),
    );
  }

  function diffView(patch) {
    const pre = h("pre", { class: "diff" });
    patch.replace(/\n$/, "").split("\n").forEach((line) => {
      const cls = line.startsWith("+") ? "add" : line.startsWith("-") ? "del" : line.startsWith("diff ") ? "file" : null;
      pre.append(h("span", cls ? { class: cls } : null, line + "\n"));
    });
    return pre;
  }

  async function viewEpisode(id) {
    const d = await api("/api/episode/" + id);
    const ep = d.episode;
    const seqOf = {};
    d.calls.forEach((c) => { seqOf[c.id] = c.seq; });
    const epRewards = d.rewards.filter((r) => r.call_seq === null);
    const last = epRewards.length ? epRewards[epRewards.length - 1] : null;
    const origin = last
      ? [last.source, last.command ? " `" + last.command.join(" ") + "`" : "", last.exit_code !== null ? " (exit " + last.exit_code + ")" : "", last.note ? " — " + last.note : ""].join("")
      : null;
    const out = h("div", null);
    out.append(
      h("h1", null, "Episode ", h("span", { class: "mono" }, ep.id), " ", status(ep.status)),
      facts([
        ["command", h("code", null, "$ " + ep.command.join(" "))],
        ["exit code", dash(ep.exit_code)],
        ["harness", dash(ep.harness)],
        ["task", dash(ep.task)],
        ["group", ep.group_id ? link("#/groups", ep.group_id) : "-"],
        ["started", when(ep.started_at)],
        ["ended", when(ep.ended_at)],
        ["calls", h("span", { id: "ep-calls" }, String(ep.calls))],
        ["stages", ep.stages ? Object.entries(ep.stages).map(([st, s]) => st + " " + s.toFixed(2) + " s").join(", ") : "-"],
        ["tokens", h("span", { id: "ep-tokens" }, String(ep.tokens))],
        ["reward", h("span", { id: "ep-reward" }, num(ep.reward))],
        ["reward from", origin ? h("span", { id: "ep-reward-origin" }, origin) : "-"],
        ["token text", d.model_dir ? h("code", null, d.model_dir) : h("span", { class: "note" }, "IDs only: " + d.text_note)],
      ]),
    );
    if (last && last.output_tail) out.append(h("details", null, h("summary", null, "verifier output (tail)"), h("pre", null, last.output_tail)));
    if (last && last.grading) out.append(gradingView(last.grading));
    if (last && last.patch) out.append(h("details", { id: "ep-patch" }, h("summary", null, "the agent's changes (" + last.patch.replace(/\n$/, "").split("\n").length + " diff lines)"), diffView(last.patch)));
    out.append(
      h("p", { class: "links" }, link("#/tree/" + ep.id, "prefix-merge tree"), link("#/audit/" + ep.id, "drift audit"), ep.group_id || ep.task ? link("#/groups", "group table") : null),
    );
    if (d.rewards.length > 1 || d.rewards.some((r) => r.call_seq !== null)) {
      out.append(
        h("h2", null, "Rewards as set"),
        table(
          ["for", { label: "reward", num: true }, "source", "command", { label: "exit", num: true }, "note", "set at"],
          d.rewards.map((r) => ({ cells: [r.call_seq === null ? "episode" : "call #" + r.call_seq, num(r.reward), r.source, r.command ? h("code", null, r.command.join(" ")) : "-", dash(r.exit_code), dash(r.note), when(r.created_at)] })),
        ),
      );
    }
    out.append(h("h2", null, "Calls (" + d.calls.length + ")"), timeline(d.calls));
    out.append(
      table(
        ["#", "dialect", "status", { label: "prompt", num: true }, { label: "output", num: true }, { label: "latency", num: true }, { label: "ttft", num: true }, "prompt render", "finish", "tools", "weights", "error"],
        d.calls.map((c) => ({
          attrs: { dataset: { id: c.id, seq: String(c.seq) } },
          cells: [
            link("#/call/" + c.id, "#" + c.seq),
            c.dialect + (c.stream ? " stream" : ""),
            status(c.status),
            String(c.prompt_tokens),
            String(c.output_tokens),
            ms(c.latency_ms),
            ms(c.ttft_ms),
            h("span", null, renderLabel(c, seqOf), c.render_note ? h("div", { class: "render-note" }, "rendered fresh: " + c.render_note) : null),
            dash(c.finish_reason),
            c.has_tools ? "yes" : "no (side request)",
            dash(c.weight_version) + (c.mixed_weight_versions ? " (mixed)" : ""),
            c.error ? h("span", { class: "status-failed" }, c.error) : "",
          ],
        })),
        { id: "calls" },
      ),
    );
    out.append(h("h2", null, "Prefix-merge trajectories (" + d.trajectories.length + ")"));
    out.append(
      table(
        ["trajectory", "calls it trains on", { label: "tokens", num: true }, { label: "trainable", num: true }, { label: "reward", num: true }],
        d.trajectories.map((t) => ({
          attrs: { dataset: { index: String(t.index) } },
          cells: [link("#/trajectory/" + ep.id + "/" + t.index, "trajectory " + t.index), t.call_seqs.map((q) => "#" + q).join(" "), String(t.tokens), String(t.trainable_tokens), num(t.reward)],
        })),
        { id: "trajectories" },
      ),
    );
    return out;
  }

  async function viewCall(id, at) {
    const d = await api("/api/call/" + id);
    const c = d.call;
    const p = c.prompt_ids.length;
    const ids = c.prompt_ids.concat(c.output_ids);
    const mask = new Array(p).fill(0).concat(new Array(c.output_ids.length).fill(1));
    const lps = new Array(p).fill(null).concat(c.output_ids.map((_, k) => (k < c.output_logprobs.length ? c.output_logprobs[k] : null)));
    const tv = tokenView({ ids: ids, mask: mask, logprobs: lps, text: d.text, spans: [[p, ids.length]], spanLabels: ["call #" + c.seq] });
    const msgs = d.messages.map((m) => h("div", { class: "msg" }, h("b", null, m.role + ": "), (m.content || "") + (m.tool_calls || []).map((t) => "\n→ " + t.name + "(" + t.arguments + ")").join("")));
    const reply = c.completion ? h("div", { class: "msg" }, h("b", null, "assistant (reply): "), (c.completion.text || "") + (c.completion.tool_calls || []).map((t) => "\n→ " + t.name + "(" + t.arguments + ")").join("")) : null;
    const node = h(
      "div",
      null,
      h("h1", null, "Call #" + c.seq + " ", status(c.status), " ", h("span", { class: "note" }, "of episode "), link("#/episode/" + d.episode_id, d.episode_id, { class: "mono" })),
      facts([
        ["request", h("code", null, c.method + " " + c.path)],
        ["dialect", c.dialect + (c.stream ? " (stream)" : "")],
        ["model", c.model],
        ["tokens", h("span", { id: "call-counts", dataset: { prompt: String(c.prompt_tokens), output: String(c.output_tokens) } }, "prompt " + c.prompt_tokens + " (masked) + output " + c.output_tokens + " (trainable)")],
        ["finish", dash(c.finish_reason)],
        ["latency", ms(c.latency_ms) + ", first token after " + ms(c.ttft_ms)],
        ["prompt render", c.render_mode + (c.render_note ? " — rendered fresh: " + c.render_note : "")],
        ["fidelity", c.fidelity],
        ["backend", dash(c.backend_kind) + " " + dash(c.backend)],
        ["weights", dash(c.weight_version) + (c.mixed_weight_versions ? " (mixed: updated during the call)" : "")],
        ["temperature", num(c.temperature)],
        ["reward", num(c.reward)],
        ["error", c.error ? h("span", { class: "status-failed" }, c.error) : undefined],
        ["token text", d.text ? "from the model folder" : h("span", { class: "note" }, "IDs only: " + d.text_note)],
      ]),
      h("details", null, h("summary", null, "messages (" + d.messages.length + ")" + (reply ? " and the reply" : "")), msgs, reply),
      tv.node,
    );
    return { node: node, after: at !== undefined ? () => tv.scrollToToken(+at) : null };
  }

  async function viewTrajectory(id, index, at) {
    const d = await api("/api/trajectory/" + id + "/" + index);
    const row = d.row;
    const tv = tokenView({ ids: row.input_ids, mask: row.loss_mask, logprobs: row.logprobs, text: d.text, spans: d.call_spans, spanLabels: d.call_seqs.map((q) => "call #" + q) });
    const idx = +index;
    const nav = h(
      "p",
      { class: "links" },
      idx > 0 ? link("#/trajectory/" + d.episode_id + "/" + (idx - 1), "← trajectory " + (idx - 1)) : null,
      idx + 1 < d.count ? link("#/trajectory/" + d.episode_id + "/" + (idx + 1), "trajectory " + (idx + 1) + " →") : null,
      link("#/tree/" + d.episode_id, "prefix-merge tree"),
    );
    const trainable = row.loss_mask.reduce((a, b) => a + b, 0);
    const node = h(
      "div",
      null,
      h("h1", null, "Trajectory " + idx + " of " + d.count + " ", h("span", { class: "note" }, "episode "), link("#/episode/" + d.episode_id, d.episode_id, { class: "mono" })),
      nav,
      facts([
        ["strategy", row.strategy || "prefix-merge"],
        ["tokens", h("span", { id: "traj-counts", dataset: { tokens: String(row.input_ids.length), trainable: String(trainable) } }, row.input_ids.length + " tokens, " + trainable + " trainable")],
        ["calls it trains on", d.call_seqs.map((q, k) => [link("#/call/" + row.call_ids[k], "#" + q), " "])],
        ["reward", num(row.reward)],
        ["weights", dash(row.weight_version)],
        ["finish", dash(row.finish_reason)],
        ["error", row.error ? h("span", { class: "status-failed" }, row.error) : undefined],
        ["token text", d.text ? "from the model folder" : h("span", { class: "note" }, "IDs only: " + d.text_note)],
      ]),
      tv.node,
    );
    return { node: node, after: at !== undefined ? () => tv.scrollToToken(+at) : null };
  }

  async function viewTree(id) {
    const d = await api("/api/tree/" + id);
    const byId = {};
    const kids = {};
    const roots = [];
    d.nodes.forEach((nd) => { byId[nd.call_id] = nd; kids[nd.call_id] = []; });
    d.nodes.forEach((nd) => { if (nd.parent && byId[nd.parent]) kids[nd.parent].push(nd.call_id); else roots.push(nd.call_id); });
    const line = (nd) => {
      const parent = nd.parent ? byId[nd.parent] : null;
      return h(
        "li",
        { class: "node" + (nd.leaf_of !== null ? " leaf" : ""), dataset: { id: nd.call_id, seq: String(nd.seq), parent: nd.parent || "" } },
        link("#/call/" + nd.call_id, "#" + nd.seq), " ", status(nd.status), " ",
        nd.prompt_tokens + " + " + nd.output_tokens + " tokens  ",
        parent ? h("span", { class: "note" }, "extends #" + parent.seq) : h("span", { class: "note" }, "root" + (nd.render_mode === "extended" ? " (recorded as extending, but its tokens do not)" : "")),
        nd.has_tools ? "" : h("span", { class: "note" }, "  side request"),
        "  ",
        nd.trajectory !== null ? link("#/trajectory/" + d.episode_id + "/" + nd.trajectory, (nd.leaf_of !== null ? "leaf of " : "trained in ") + "trajectory " + nd.trajectory) : null,
      );
    };
    const chain = (start) => {
      const ul = h("ul");
      let cur = start;
      while (cur) {
        ul.append(line(byId[cur]));
        const k = kids[cur];
        if (k.length === 1) cur = k[0];
        else {
          if (k.length) ul.append(h("li", { class: "branch" }, h("ul", { class: "branches" }, k.map((x) => h("li", null, chain(x))))));
          cur = null;
        }
      }
      return ul;
    };
    const tree = h("ul", { class: "tree", id: "tree", dataset: { nodes: String(d.nodes.length), roots: String(roots.length) } }, roots.map((r) => h("li", null, chain(r))));
    return h(
      "div",
      null,
      h("h1", null, "Prefix-merge tree of ", link("#/episode/" + d.episode_id, d.episode_id, { class: "mono" })),
      h("p", { class: "note" }, "A call hangs under the earlier call whose prompt + output its prompt extends, token for token. Each leaf's path is one trajectory; a call shared by branches is trained in the first of them (T3: every call in exactly one)."),
      d.nodes.length ? tree : h("p", null, "No exported calls."),
      h("h2", null, "Trajectories (" + d.trajectories.length + ")"),
      table(
        ["trajectory", "leaf", "calls it trains on", { label: "tokens", num: true }],
        d.trajectories.map((t) => ({ cells: [link("#/trajectory/" + d.episode_id + "/" + t.index, "trajectory " + t.index), "#" + byId[t.leaf].seq, t.call_ids.map((c) => "#" + byId[c].seq).join(" "), String(t.tokens)] })),
      ),
      d.excluded.length
        ? [h("h2", null, "Not exported (" + d.excluded.length + ")"), h("p", { class: "note" }, "Calls that did not end ok are left out of exports unless --include-failed."), table(["#", "status"], d.excluded.map((c) => ({ cells: [link("#/call/" + c.call_id, "#" + c.seq), status(c.status)] })))]
        : null,
    );
  }

  async function viewAudit(id) {
    const d = await api("/api/audit/" + id);
    const head = h("h1", null, "Drift audit of ", link("#/episode/" + d.episode_id, d.episode_id, { class: "mono" }));
    const about = h("p", { class: "note" }, "Each call's conversation re-rendered fresh from text, as a system that re-tokenizes would, against the prompt IDs the model consumed (`polarproxy audit`).");
    if (d.error) return h("div", null, head, about, errorBox({ message: d.error, hint: d.hint }));
    const a = d.audit;
    const node = h(
      "div",
      null,
      head,
      about,
      facts([
        ["model folder", h("code", null, dash(a.model_dir))],
        ["calls", String(a.calls)],
        ["audited", String(a.audited)],
        ["identical", h("span", { id: "audit-identical" }, String(a.identical))],
        ["drifted", h("span", { id: "audit-drifted" }, String(a.drifted))],
        ["skipped", String(a.skipped) + (a.skipped ? " " + JSON.stringify(a.skipped_by_reason) : "")],
        ["unexpected (fresh calls that drift)", String(a.unexpected)],
        ["prefix breaks", String(a.prefix_breaks)],
        ["drifted tokens", a.drifted_tokens + " of " + a.prompt_tokens + " (" + (100 * a.drifted_share).toFixed(1) + "%)"],
      ]),
      table(
        ["#", "render", "result", { label: "first diff", num: true }, { label: "drifted", num: true }, { label: "changed rec/fresh", num: true }, "prefix exact", "note"],
        a.per_call.map((c) => ({
          attrs: { dataset: { id: c.call_id, seq: String(c.seq), firstDiff: c.first_diff === null ? "" : String(c.first_diff) } },
          cells: [
            link("#/call/" + c.call_id, "#" + c.seq),
            c.render_mode,
            h("span", { class: c.result === "drifted" ? "status-failed" : c.result === "identical" ? "status-ok" : "" }, c.result),
            c.first_diff === null ? "-" : link("#/call/" + c.call_id + "?at=" + c.first_diff, String(c.first_diff)),
            String(c.drifted_tokens),
            c.changed_recorded + " / " + c.changed_fresh,
            dash(c.prefix_exact),
            c.unexpected ? "unexpected: rendered fresh, yet differs" : dash(c.skip_reason || c.error),
          ],
        })),
        { id: "audit-calls" },
      ),
    );
    if (Object.keys(d.windows).length) {
      node.append(h("p", { class: "note" }, "Side by side from a few tokens before each drifted call's first difference (outlined); the tokens that differ, once the common prefix and suffix are taken off, are underlined. Open a call at that position from the first-diff column."));
    }
    for (const c of a.per_call) {
      const w = d.windows[c.call_id];
      if (!w) continue;
      const infoEl = h("div", { class: "tokinfo" }, "Click a token for its ID.");
      node.append(
        h("h2", null, "Call #" + c.seq + ": first difference at position " + w.first_diff),
        infoEl,
        h(
          "div",
          { class: "side", dataset: { call: c.call_id, firstDiff: String(w.first_diff) } },
          h("div", { class: "recorded" }, h("h3", null, "recorded (what the model saw), from #" + w.start), tokenStrip(w.recorded, w.text, w.start, w.first_diff, c.changed_recorded, infoEl)),
          h("div", { class: "fresh" }, h("h3", null, "fresh re-render, from #" + w.start), tokenStrip(w.fresh, w.text, w.start, w.first_diff, c.changed_fresh, infoEl)),
        ),
      );
    }
    return node;
  }

  async function viewGroups() {
    const d = await api("/api/groups");
    const sm = d.summary;
    const out = h(
      "div",
      null,
      h("h1", null, "Groups"),
      h(
        "p",
        { class: "note" },
        "Rewards by group (an episode's group ID, else its task), with the GRPO advantages `polarproxy export --advantages grpo` computes over " +
          (INFO && INFO.report ? "the whole store (this report shows this episode's group)" : "the whole store") +
          ": (r − group mean) / (group std + 1e-6). A group whose rewards are all equal teaches nothing; the export drops it.",
      ),
      facts([
        ["groups with a reward", String(sm.groups)],
        ["episodes with an advantage", String(sm.episodes)],
        ["episodes without reward", String(sm.episodes_without_reward)],
        ["zero-variance groups (dropped)", String(sm.zero_variance_groups)],
        ["episodes in no group", String(d.ungrouped)],
      ]),
    );
    if (!d.groups.length) out.append(h("p", null, "No episode has a group or a task (record with --group / --task)."));
    for (const g of d.groups) {
      out.append(
        h("h2", null, g.key, g.zero_variance ? h("span", { class: "note" }, "  all rewards equal: dropped by the export") : null),
        table(
          ["episode", "task", "status", { label: "reward", num: true }, { label: "advantage", num: true }],
          g.episodes.map((e) => ({
            attrs: { dataset: { id: e.id } },
            cells: [link("#/episode/" + e.id, e.id, { class: "mono" }), dash(e.task), status(e.status), num(e.reward), e.advantage === null ? (e.reward === null ? "no reward" : "dropped") : num(e.advantage, 4)],
          })),
          { class: "grid group", dataset: { key: g.key, rewarded: String(g.rewarded) } },
        ),
        h("p", { class: "note" }, g.rewarded + " rewarded, mean reward " + num(g.reward_mean)),
      );
    }
    return out;
  }

  async function viewMetrics() {
    if (INFO && !INFO.metrics) {
      return h("div", null, h("h1", null, "Training"), h("p", null, "No training metrics: start the viewer with --metrics DIR (a `polarproxy train` output folder holding metrics.jsonl)."));
    }
    const d = await api("/api/metrics");
    if (d.error) throw new ApiError(d.error, "Training curves are re-read on every reload.", 500);
    const rows = d.rows;
    const charts = h("div", { class: "charts" });
    const keys = [["reward_mean", "reward (mean of the step's rows)"], ["loss", "loss"], ["clip_frac", "clip fraction"], ["kl", "KL to the reference"]];
    for (const [key, title] of keys) {
      const all = rows.map((r) => [r.step, typeof r[key] === "number" ? r[key] : null]);
      charts.append(lineChart(title, all.filter((p) => p[1] !== null), { key: key, all: all }));
    }
    const lastRows = rows.slice(-20);
    const cols = ["step", "loss", "reward_mean", "clip_frac", "kl", "entropy", "grad_norm", "tokens_per_s", "weight_version"];
    return h(
      "div",
      null,
      h("h1", null, "Training"),
      h("p", { class: "note" }, rows.length + " steps from ", h("code", null, d.file), " (reload for new steps)"),
      charts,
      h("h2", null, "Last steps"),
      table(cols.map((c) => ({ label: c, num: c !== "weight_version" })), lastRows.map((r) => ({ cells: cols.map((c) => num(r[c])) }))),
    );
  }

  // ---- routing ----------------------------------------------------------------------------------------

  const ROUTES = [
    [/^#?\/?$/, "list", viewList],
    [/^#\/episode\/([^/?]+)$/, "episode", viewEpisode],
    [/^#\/call\/([^/?]+)(?:\?at=(\d+))?$/, "call", viewCall],
    [/^#\/trajectory\/([^/?]+)\/(\d+)(?:\?at=(\d+))?$/, "trajectory", viewTrajectory],
    [/^#\/tree\/([^/?]+)$/, "tree", viewTree],
    [/^#\/audit\/([^/?]+)$/, "audit", viewAudit],
    [/^#\/groups$/, "groups", viewGroups],
    [/^#\/metrics$/, "metrics", viewMetrics],
  ];
  let navigation = 0;

  async function route() {
    const mine = ++navigation;
    main.dataset.ready = "0";
    const hash = location.hash || (REPORT && INFO ? "#/episode/" + INFO.report_episode : "#/");
    let name = "missing";
    let node;
    let after = null;
    const started = performance.now();
    try {
      const match = ROUTES.map(([re, n, fn]) => [hash.match(re), n, fn]).find((m) => m[0]);
      if (!match) throw new ApiError("No page " + hash + ".", "Open the episode list.", 404);
      name = match[1];
      const args = match[0].slice(1).map((x) => (x === undefined ? undefined : decodeURIComponent(x)));
      const out = await match[2](...args);
      node = out instanceof Node ? out : out.node;
      after = out instanceof Node ? null : out.after;
    } catch (e) {
      node = errorBox(e);
      name = "error";
    }
    if (mine !== navigation) return;
    main.replaceChildren(node);
    document.body.dataset.view = name;
    for (const a of document.querySelectorAll("header nav a")) a.classList.toggle("active", a.dataset.nav === name);
    if (after) after();
    else window.scrollTo(0, 0);
    main.dataset.renderMs = String(Math.round(performance.now() - started));
    main.dataset.ready = "1";
  }

  async function start() {
    try {
      INFO = await api("/api/info");
      document.getElementById("source").textContent = INFO.report
        ? "report of " + INFO.report_episode + " from " + INFO.db + (INFO.calls_left_out && INFO.calls_left_out.length ? " (" + INFO.calls_left_out.length + " calls' tokens left out)" : "")
        : INFO.db + " (read-only)";
    } catch (e) {
      main.replaceChildren(errorBox(e));
      main.dataset.ready = "1";
      return;
    }
    window.addEventListener("hashchange", route);
    route();
  }

  start();
})();
