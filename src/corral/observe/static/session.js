"use strict";
// The dashboard's credentials stay in this tab. The address printed by `corral dashboard`
// ends in #login=CODE (a fragment: never sent to a server, never logged); the code works
// once and is traded here for a session token kept in sessionStorage and sent as an
// Authorization header. There is no cookie, so no other server on this host (another
// 127.0.0.1 port) is ever sent a credential; after the dashboard restarts, old tokens are
// refused. CorralEventSource is EventSource with that header (fetch + a stream reader).
const corralSession = (() => {
  const KEY = "corral-session";
  const params = new URLSearchParams(location.hash.slice(1));
  const code = params.get("login");
  if (code !== null) {
    params.delete("login");
    const rest = params.toString();
    history.replaceState(null, "", rest ? `#${rest}` : location.pathname);
  }
  const ready = (async () => {
    if (code) {
      const r = await fetch("/api/session", {
        method: "POST", cache: "no-store", headers: { Authorization: `Bearer ${code}` },
      });
      if (r.ok) sessionStorage.setItem(KEY, (await r.json()).session);
    }
    return sessionStorage.getItem(KEY);
  })();
  return { ready };
})();

class CorralEventSource {
  constructor(url) {
    this.url = url;
    this.handlers = {};
    this.closed = false;
    this.abort = null;
    this.run();
  }

  addEventListener(name, fn) { (this.handlers[name] ||= []).push(fn); }

  emit(name, ev) { for (const fn of this.handlers[name] || []) fn(ev); }

  close() {
    this.closed = true;
    if (this.abort) this.abort.abort();
  }

  async run() {
    while (!this.closed) {
      let status = 0;
      try {
        const token = await corralSession.ready;
        this.abort = new AbortController();
        const r = await fetch(this.url, {
          cache: "no-store", signal: this.abort.signal,
          headers: token ? { Authorization: `Bearer ${token}` } : {},
        });
        status = r.status;
        if (!r.ok) throw new Error(`HTTP ${r.status}`);
        this.emit("open", {});
        await this.read(r.body.getReader());
      } catch (err) {
        if (this.closed) return;
      }
      if (this.closed) return;
      this.emit("error", { status });
      if (status === 401) {
        const conn = document.getElementById("conn");
        if (conn) conn.textContent = "not signed in: open the address corral dashboard printed";
      }
      await new Promise((resolve) => setTimeout(resolve, 2000));
    }
  }

  async read(reader) {
    const decoder = new TextDecoder();
    let buffered = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffered += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffered.indexOf("\n\n")) >= 0) {
        const block = buffered.slice(0, end);
        buffered = buffered.slice(end + 2);
        let name = "message";
        const data = [];
        for (const line of block.split("\n")) {
          if (line.startsWith("event: ")) name = line.slice(7);
          else if (line.startsWith("data: ")) data.push(line.slice(6));
        }
        if (data.length) this.emit(name, { data: data.join("\n") });
      }
    }
  }
}
