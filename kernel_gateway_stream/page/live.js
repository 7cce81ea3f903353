// The live output page: the kernels, and one kernel's executions with their output as
// it happens, from GET /api/kernels and the kernel's SSE stream (resumed by seq after any
// disconnect, the browser's EventSource sending Last-Event-ID). Nothing a kernel sends is
// ever parsed as HTML in this page: text goes in with textContent, images only as
// base64 data URLs, and text/html outputs in an iframe sandboxed without scripts.
"use strict";

(function () {
  const base = location.pathname.replace(/kernel_gateway_stream\/.*$/, "");
  const WINDOW = 5000; // records replayed when a kernel is opened; earlier ones on demand
  const MAX_BLOCK = 200000; // characters a stream block keeps on the page
  const TYPES = [
    "stream", "display_data", "update_display_data", "execute_input", "execute_result",
    "error", "status", "clear_output", "input_request",
    "kernel_gateway_stream_gap", "kernel_gateway_stream_lifecycle",
    "kernel_gateway_stream_discarded", "kernel_gateway_stream_invalid",
  ];
  const ENDINGS = ["kernel_shutdown", "gateway_shutdown", "slow_consumer", "server_error"];
  const $ = (id) => document.getElementById(id);

  let kernelId = null;
  let source = null;
  let lastSeq = 0;
  let firstShown = 0;
  let ended = false;
  let view = null;

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  async function api(path) {
    const response = await fetch(base + path, { credentials: "same-origin" });
    if (!response.ok) {
      const error = new Error(`${response.status} ${path}`);
      error.status = response.status;
      throw error;
    }
    return response.json();
  }

  function setConnection(state, text) {
    const badge = $("connection");
    badge.className = "connection " + state;
    badge.textContent = text;
  }

  // -- ANSI SGR colours (what tracebacks and coloured output use); other escapes dropped.
  function appendAnsi(parent, text) {
    const pattern = /\x1b\[([0-9;]*)([A-Za-z])/g;
    let style = { fg: null, bg: null, bold: false };
    let at = 0;
    const flush = (chunk) => {
      if (!chunk) return;
      if (style.fg === null && style.bg === null && !style.bold) {
        parent.appendChild(document.createTextNode(chunk));
        return;
      }
      const classes = [];
      if (style.fg !== null) classes.push("ansi-fg-" + style.fg);
      if (style.bg !== null) classes.push("ansi-bg-" + style.bg);
      if (style.bold) classes.push("ansi-bold");
      parent.appendChild(el("span", classes.join(" "), chunk));
    };
    let match;
    while ((match = pattern.exec(text)) !== null) {
      flush(text.slice(at, match.index));
      at = pattern.lastIndex;
      if (match[2] !== "m") continue;
      const codes = match[1] === "" ? [0] : match[1].split(";").map(Number);
      for (let i = 0; i < codes.length; i++) {
        const code = codes[i];
        if (code === 0) style = { fg: null, bg: null, bold: false };
        else if (code === 1) style.bold = true;
        else if (code === 22) style.bold = false;
        else if (code >= 30 && code <= 37) style.fg = code - 30;
        else if (code >= 90 && code <= 97) style.fg = code - 90;
        else if (code === 39) style.fg = null;
        else if (code >= 40 && code <= 47) style.bg = code - 40;
        else if (code >= 100 && code <= 107) style.bg = code - 100;
        else if (code === 49) style.bg = null;
        else if (code === 38 || code === 48) i += codes[i + 1] === 5 ? 2 : 4; // 256/rgb
      }
    }
    flush(text.slice(at).replace(/\x1b[^a-zA-Z]*[a-zA-Z]?/g, ""));
  }

  // -- Carriage returns, as Jupyter frontends render them: text after "\r" replaces the
  // line (a progress bar updates in place).
  function foldCarriageReturns(text) {
    return text
      .split("\n")
      .map((line) => {
        if (line.indexOf("\r") < 0) return line;
        const parts = line.split("\r");
        for (let i = parts.length - 1; i >= 0; i--) if (parts[i] !== "") return parts[i];
        return "";
      })
      .join("\n");
  }

  // -- One view of executions (the live one, or a page of earlier output).
  function View(list) {
    this.list = list;
    this.executions = new Map();
    this.displays = new Map();
  }

  View.prototype.execution = function (parentId, header) {
    let execution = this.executions.get(parentId);
    if (execution) return execution;
    const item = el("li", "execution");
    const head = el("div", "head");
    const count = el("span", "count", "[ ]");
    const status = el("span", "status running", "running");
    const when = el("span", "when", header && header.date ? new Date(header.date).toLocaleTimeString() : "");
    const duration = el("span", "duration", "");
    head.append(count, status, when, duration);
    const code = el("pre", "code", "");
    code.hidden = true;
    const outputs = el("div", "outputs");
    item.append(head, code, outputs);
    this.list.appendChild(item);
    execution = { item, count, status, duration, code, outputs, block: null, started: null, clearPending: false };
    this.executions.set(parentId, execution);
    return execution;
  };

  View.prototype.clearIfPending = function (execution) {
    if (!execution.clearPending) return;
    execution.clearPending = false;
    execution.outputs.replaceChildren();
    execution.block = null;
  };

  View.prototype.apply = function (message) {
    const type = message.msg_type;
    const content = message.content || {};
    const parentId = (message.parent_header && message.parent_header.msg_id) || null;
    if (type.startsWith("kernel_gateway_stream_")) return this.notice(type, content, parentId);
    if (!parentId) return;
    if (type === "status") {
      if (!this.executions.has(parentId)) return; // kernel_info and the like
      const execution = this.execution(parentId);
      if (content.execution_state === "busy") execution.started = message.header.date;
      if (content.execution_state === "idle" && execution.started) {
        const seconds = (new Date(message.header.date) - new Date(execution.started)) / 1000;
        execution.duration.textContent = seconds >= 0 ? seconds.toFixed(2) + " s" : "";
        if (execution.status.textContent === "running") {
          execution.status.textContent = "ok";
          execution.status.className = "status ok";
        }
      }
      if (content.execution_state === "dead" || content.execution_state === "restarting") {
        execution.status.textContent = content.execution_state === "dead" ? "died" : "kernel restarted";
        execution.status.className = "status error";
      }
      return;
    }
    const execution = this.execution(parentId, message.parent_header);
    if (type === "execute_input") {
      execution.code.textContent = content.code || "";
      execution.code.hidden = !content.code;
      execution.count.textContent = `[${content.execution_count ?? " "}]`;
      if (!execution.started) execution.started = message.header.date;
      return;
    }
    if (type === "clear_output") {
      if (content.wait) execution.clearPending = true;
      else { execution.outputs.replaceChildren(); execution.block = null; }
      return;
    }
    this.clearIfPending(execution);
    if (type === "stream") return this.stream(execution, content.name, content.text || "");
    execution.block = null;
    if (type === "error") {
      execution.status.textContent = "error";
      execution.status.className = "status error";
      const box = el("div", "out error");
      box.appendChild(el("div", "ename", `${content.ename}: ${content.evalue}`));
      const trace = el("div", "traceback");
      appendAnsi(trace, (content.traceback || []).join("\n"));
      box.appendChild(trace);
      execution.outputs.appendChild(box);
      return;
    }
    if (type === "execute_result" || type === "display_data" || type === "update_display_data") {
      if (type === "execute_result") execution.count.textContent = `[${content.execution_count}]`;
      const node = renderData(content.data || {});
      const displayId = content.transient && content.transient.display_id;
      if (type === "update_display_data") {
        const previous = displayId && this.displays.get(displayId);
        if (previous && previous.isConnected) { previous.replaceWith(node); this.displays.set(displayId, node); }
        return;
      }
      if (displayId) this.displays.set(displayId, node);
      execution.outputs.appendChild(node);
      return;
    }
    if (type === "input_request") {
      execution.outputs.appendChild(el("div", "out notice", `waiting for input: ${content.prompt || ""}`));
    }
  };

  View.prototype.stream = function (execution, name, text) {
    let block = execution.block;
    if (!block || block.name !== name) {
      block = { name, text: "", node: el("div", "out " + (name === "stderr" ? "stderr" : "stdout")) };
      execution.outputs.appendChild(block.node);
      execution.block = block;
    }
    block.text = foldCarriageReturns(block.text + text);
    let shown = block.text;
    block.node.replaceChildren();
    if (shown.length > MAX_BLOCK) {
      block.node.appendChild(el("div", "trimmed", "… earlier lines of this output are in the transcript"));
      shown = shown.slice(shown.length - MAX_BLOCK);
      block.text = shown;
    }
    appendAnsi(block.node, shown);
  };

  View.prototype.notice = function (type, content, parentId) {
    let text;
    if (type === "kernel_gateway_stream_gap" && content.reason === "gateway_stopped") {
      text = `The gateway stopped uncleanly: output after seq ${content.first_seq - 1} was not recorded.`;
    } else if (type === "kernel_gateway_stream_gap") {
      text = `seq ${content.first_seq}–${content.last_seq}: not recorded (${content.reason})`;
    } else if (type === "kernel_gateway_stream_discarded") {
      text = `seq ${content.first_seq}–${content.last_seq}: removed by retention`;
    } else if (type === "kernel_gateway_stream_lifecycle") {
      text = `kernel ${content.event} (${content.reason})`;
    } else {
      text = `an invalid message from the kernel was refused (${content.reason || ""})`;
    }
    const node = el("div", "out notice", text);
    const execution = parentId && this.executions.get(parentId);
    if (execution) execution.outputs.appendChild(node);
    else $("notices").appendChild(node);
  };

  function renderData(data) {
    const box = el("div", "out");
    for (const mime of ["image/png", "image/jpeg", "image/gif"]) {
      const value = typeof data[mime] === "string" ? data[mime].replace(/\s/g, "") : "";
      if (value && /^[A-Za-z0-9+/=]+$/.test(value)) {
        const image = el("img");
        image.alt = "image output";
        image.src = `data:${mime};base64,${value}`;
        box.appendChild(image);
        return box;
      }
    }
    if (typeof data["text/html"] === "string" || Array.isArray(data["text/html"])) {
      const frame = el("iframe");
      frame.setAttribute("sandbox", ""); // no scripts, no same-origin, no forms
      frame.setAttribute("referrerpolicy", "no-referrer");
      frame.srcdoc = [].concat(data["text/html"]).join("");
      frame.title = "HTML output (sandboxed)";
      box.appendChild(frame);
      return box;
    }
    const plain = data["text/plain"];
    appendAnsi(box, [].concat(plain === undefined ? "" : plain).join(""));
    return box;
  }

  // -- Messages from the SSE stream or the transcript, in seq order, each applied once.
  function accept(message, seq, target) {
    if (target === view) {
      if (seq <= lastSeq) return; // a merged frame or a record already shown
      lastSeq = seq;
    }
    target.apply(message);
  }

  async function catchUpFromTranscript() {
    // The kernel is gone (the gateway restarted without it, or it shut down): its
    // transcript still holds what this page missed.
    for (;;) {
      const page = await api(`api/kernels/${kernelId}/transcript?since=${lastSeq}&limit=1000`);
      for (const record of page.records) accept(record, record.seq, view);
      if (!page.records.length || page.next_since <= lastSeq) break;
    }
  }

  function follow(since) {
    const url = `${base}api/kernels/${kernelId}/stream?since=${since}`;
    source = new EventSource(url, { withCredentials: true });
    const mine = source;
    source.onopen = () => { if (source === mine) setConnection("live", "live"); };
    source.onerror = async (event) => {
      // A kernel's "error" message is an SSE event named "error", which EventSource also
      // delivers here: it carries data; a connection error does not.
      if (event instanceof MessageEvent) return;
      if (source !== mine || ended) return;
      if (mine.readyState === EventSource.CLOSED) {
        // Refused (the kernel is not running here now): read the rest from the
        // transcript, then look again in a while (a restarting gateway comes back).
        setConnection("reconnecting", "kernel not running here; reading its transcript");
        try { await catchUpFromTranscript(); setKernelState("ended"); } catch (error) { /* gateway down */ }
        setTimeout(() => { if (source === mine && !ended) follow(lastSeq); }, 2000);
        return;
      }
      setConnection("reconnecting", "reconnecting…");
    };
    for (const type of TYPES) {
      source.addEventListener(type, (event) => {
        if (source !== mine) return;
        const message = JSON.parse(event.data);
        accept(message, Number(event.lastEventId), view);
        if (message.msg_type === "status" && !message.parent_header.msg_id) return;
        if (message.msg_type === "status") setKernelState(message.content.execution_state);
      });
    }
    for (const reason of ENDINGS) {
      source.addEventListener(reason, (event) => {
        if (source !== mine) return;
        if (reason === "kernel_shutdown") {
          ended = true;
          mine.close();
          setKernelState("ended");
          setConnection("ended", "kernel shut down");
        } else if (reason === "gateway_shutdown") {
          setConnection("reconnecting", "gateway restarting; will resume");
        }
        // Otherwise (slow_consumer, server_error) the browser reconnects by itself, with
        // Last-Event-ID, and nothing is missed.
      });
    }
  }

  function setKernelState(state) {
    const badge = $("kernel-state");
    badge.textContent = state;
    badge.className = "state " + state;
    if (state === "ended" && view) {
      // Executions that never finished will not now.
      for (const execution of view.executions.values()) {
        if (execution.status.textContent === "running") {
          execution.status.textContent = "unfinished (kernel gone)";
          execution.status.className = "status error";
        }
      }
      listKernels();
    }
  }

  async function open(id) {
    if (source) source.close();
    source = null;
    kernelId = id;
    lastSeq = 0;
    ended = false;
    $("executions").replaceChildren();
    $("earlier-output").replaceChildren();
    $("notices").replaceChildren();
    view = new View($("executions"));
    $("hint").hidden = true;
    $("kernel-head").hidden = false;
    $("kernel-title").textContent = id;
    setKernelState("");
    for (const link of document.querySelectorAll("#kernels a")) {
      link.classList.toggle("selected", link.dataset.kernel === id);
    }
    let head = 0;
    let first = 1;
    try {
      const top = await api(`api/kernels/${id}/transcript?limit=1`);
      head = top.head;
      first = top.first_seq || 1;
    } catch (error) { /* an unknown kernel: the stream says so */ }
    const since = Math.max(first - 1, head - WINDOW, 0);
    lastSeq = since;
    firstShown = since;
    $("earlier").hidden = since <= first - 1;
    follow(since);
  }

  async function showEarlier() {
    const until = firstShown;
    const from = Math.max(0, until - WINDOW);
    const earlier = new View(el("ol", "executions"));
    $("earlier-output").prepend(earlier.list);
    let since = from;
    while (since < until) {
      const page = await api(`api/kernels/${kernelId}/transcript?since=${since}&limit=${Math.min(1000, until - since)}`);
      for (const record of page.records) if (record.seq <= until) earlier.apply(record);
      if (!page.records.length) break;
      since = page.next_since;
    }
    // An execution that did not end in this page of earlier output goes on in the next:
    // it is not running (the part below says how it ended).
    for (const execution of earlier.executions.values()) {
      if (!execution.status.classList.contains("running")) continue;
      execution.status.className = "status continued";
      execution.status.textContent = "continues below";
    }
    firstShown = from;
    $("earlier").hidden = from === 0;
  }

  async function listKernels() {
    let kernels;
    try {
      kernels = await api("api/kernels");
    } catch (error) {
      if (!kernelId) setConnection("reconnecting", "gateway unreachable");
      return;
    }
    const list = $("kernels");
    list.replaceChildren();
    if (!kernels.length) list.appendChild(el("li", "empty", "no kernels running"));
    for (const kernel of kernels) {
      const link = el("a");
      link.href = "#" + encodeURIComponent(kernel.id);
      link.dataset.kernel = kernel.id;
      if (kernel.id === kernelId) link.classList.add("selected");
      link.append(
        el("div", "name", kernel.name),
        el("div", "meta", `${kernel.execution_state} · ${kernel.connections} connected · ${kernel.id.slice(0, 8)}`),
      );
      const item = el("li");
      item.appendChild(link);
      list.appendChild(item);
    }
  }

  function route() {
    const id = decodeURIComponent(location.hash.slice(1));
    if (id && id !== kernelId) open(id);
  }

  $("earlier").addEventListener("click", showEarlier);
  window.addEventListener("hashchange", route);
  listKernels();
  setInterval(listKernels, 3000);
  route();
})();
