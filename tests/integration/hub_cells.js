async (base) => {
  // Runs the code cells of the notebook gpu.ipynb on this page's single-user server, as
  // its logged-in user (the session cookie and the _xsrf token), through Jupyter's REST
  // API and kernel websocket: a session for the notebook, an execute_request per cell.
  // Each cell's output is shown in a <pre id="vf-cell-N"> of the page; the body's
  // data-vf says "done" or "failed" at the end. Returns at once: the cells run on.
  const xsrf = decodeURIComponent(
    (document.cookie.split("; ").find((c) => c.startsWith("_xsrf=")) || "=").split("=")[1]
  );
  const headers = { "Content-Type": "application/json", "X-XSRFToken": xsrf };
  const call = async (method, path, body) => {
    const r = await fetch(base + path, { method, headers, body: body && JSON.stringify(body) });
    if (!r.ok) throw new Error(`${method} ${path}: ${r.status} ${await r.text()}`);
    return r.json();
  };
  const show = (i, text) => {
    let pre = document.getElementById(`vf-cell-${i}`);
    if (!pre) {
      pre = document.createElement("pre");
      pre.id = `vf-cell-${i}`;
      document.body.appendChild(pre);
    }
    pre.textContent += text;
  };
  const run = async () => {
    const notebook = await call("GET", "api/contents/gpu.ipynb?type=notebook&content=1");
    const cells = notebook.content.cells.filter((c) => c.cell_type === "code");
    const session = await call("POST", "api/sessions", {
      path: "gpu.ipynb", name: "gpu.ipynb", type: "notebook", kernel: { name: "python3" },
    });
    const url = `ws://${location.host}${base}api/kernels/${session.kernel.id}/channels`;
    const ws = new WebSocket(`${url}?session_id=${session.id}`);
    await new Promise((opened, failed) => {
      ws.onopen = opened;
      ws.onerror = () => failed(new Error("kernel websocket did not open"));
    });
    const running = new Map();
    ws.onmessage = (event) => {
      const msg = JSON.parse(event.data);
      const cell = running.get(msg.parent_header.msg_id);
      if (!cell) return;
      const c = msg.content;
      if (msg.msg_type === "stream") show(cell.i, c.text);
      else if (msg.msg_type === "error") show(cell.i, `${c.ename}: ${c.evalue}\n`);
      else if (msg.msg_type === "execute_result") show(cell.i, `${c.data["text/plain"]}\n`);
      else if (msg.msg_type === "execute_reply") cell.replied = c.status;
      else if (msg.msg_type === "status" && c.execution_state === "idle") cell.idle = true;
      if (cell.replied && cell.idle) cell.done(cell.replied);
    };
    for (const [i, cell] of cells.entries()) {
      show(i, "");
      const msgId = crypto.randomUUID();
      const finished = new Promise((done) => running.set(msgId, { i, done }));
      ws.send(JSON.stringify({
        header: {
          msg_id: msgId, session: session.id, username: "", msg_type: "execute_request",
          version: "5.3", date: new Date().toISOString(),
        },
        parent_header: {}, metadata: {}, channel: "shell", buffers: [],
        content: {
          code: Array.isArray(cell.source) ? cell.source.join("") : cell.source,
          silent: false, store_history: true, user_expressions: {}, allow_stdin: false,
          stop_on_error: true,
        },
      }));
      if ((await finished) !== "ok") throw new Error(`cell ${i} failed`);
    }
    ws.close();
  };
  run().then(
    () => { document.body.dataset.vf = "done"; },
    (err) => { show("error", String(err)); document.body.dataset.vf = "failed"; },
  );
}
