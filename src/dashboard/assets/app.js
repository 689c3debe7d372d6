// Scarab's dashboard: live refresh from the event stream, log tails, confirmations.
// No inline script anywhere (the page's Content-Security-Policy forbids it); every
// text from the server is set as text, never as markup, except the main region the
// server rendered (and escaped) itself.
"use strict";
(function () {
  const tails = new Map(); // log URL -> {offset, text, done}

  function tail(pre) {
    const url = pre.dataset.log;
    const known = tails.get(url) || { offset: 0, text: "", done: false, busy: false };
    tails.set(url, known);
    pre.textContent = known.text;
    if (known.done || known.busy) return;
    known.busy = true;
    const next = () => {
      fetch(url + "&offset=" + known.offset, { credentials: "same-origin" })
        .then((response) => {
          if (!response.ok) { known.busy = false; return; }
          const offset = Number(response.headers.get("X-Next-Offset") || known.offset);
          const done = response.headers.get("X-Done") === "1";
          return response.text().then((text) => {
            if (text) {
              known.text += text;
              document.querySelectorAll("pre[data-log]").forEach((p) => {
                if (p.dataset.log === url) {
                  const atEnd = p.scrollTop + p.clientHeight >= p.scrollHeight - 4;
                  p.textContent = known.text;
                  if (atEnd) p.scrollTop = p.scrollHeight;
                }
              });
            }
            known.offset = offset;
            known.done = done;
            if (done) { known.busy = false; return; }
            setTimeout(next, text ? 300 : 1000);
          });
        })
        .catch(() => setTimeout(next, 2000));
    };
    next();
  }

  function wire() {
    document.querySelectorAll("pre[data-log]").forEach(tail);
    document.querySelectorAll("button.danger").forEach((button) => {
      if (button.dataset.wired) return;
      button.dataset.wired = "1";
      button.addEventListener("click", (event) => {
        if (!window.confirm(button.textContent + "?")) event.preventDefault();
      });
    });
  }

  let pending = null;
  function refresh() {
    pending = null;
    const main = document.getElementById("main");
    // Someone typing in a form keeps what they typed: refresh later.
    if (main.contains(document.activeElement) && document.activeElement.matches("input, select, textarea")) {
      pending = setTimeout(refresh, 1000);
      return;
    }
    fetch(window.location.href, { credentials: "same-origin", headers: { "X-Scarab-Fragment": "main" } })
      .then((response) => (response.ok ? response.text() : null))
      .then((html) => {
        if (html === null) return;
        main.innerHTML = html;
        wire();
      });
  }

  const live = document.body.dataset.live;
  if (live && window.EventSource) {
    const source = new EventSource(live);
    const changed = () => { if (!pending) pending = setTimeout(refresh, 200); };
    source.addEventListener("message", changed);
    source.addEventListener("reset", changed);
  }
  wire();
})();
