"""A headless Chromium driven over the DevTools protocol: enough to click through the Dagster UI
and screenshot it as a person sees it (the lock has no Playwright or Selenium; `websockets`
comes with uvicorn, which dagster-webserver needs).

Chromium listens on 127.0.0.1 only (a port it picks) and is stopped, with its whole process
group, when the `Browser` closes.
"""

import base64
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

CHROMIUM = os.environ.get("SPICA_CHROMIUM", "/usr/bin/chromium")
_LISTENING = re.compile(r"DevTools listening on (ws://\S+)")


class BrowserError(RuntimeError):
    pass


class Browser:
    """One page of a headless Chromium. `goto`, `wait_for` (a JS expression), `click_text`,
    `evaluate`, `screenshot`; use as a context manager."""

    def __init__(self, profile: Path, width: int = 1400, height: int = 900, start_timeout: float = 60.0):
        from websockets.sync.client import connect

        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-dev-shm-usage", "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
             f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
        url = self._listening(start_timeout)
        self._connection = connect(url, max_size=None, open_timeout=30)
        self.ws = self._connection.__enter__()
        self._id = 0
        target = self._call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self._call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.width, self.height = width, height
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.resize(width, height)

    def _listening(self, timeout: float) -> str:
        assert self.proc.stderr is not None
        deadline = time.monotonic() + timeout
        seen = []
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                if self.proc.poll() is not None:
                    break
                continue
            seen.append(line)
            found = _LISTENING.search(line)
            if found:
                return found.group(1)
        self.close()
        raise BrowserError(f"chromium did not start its DevTools endpoint: {''.join(seen)[-2000:]}")

    # ---- protocol ------------------------------------------------------------------------------

    def _call(self, method: str, session: str | None = None, timeout: float = 60.0, **params: Any) -> dict:
        self._id += 1
        ident = self._id
        message: dict[str, Any] = {"id": ident, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        self.ws.send(json.dumps(message))
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"{method}: no answer within {timeout:.0f}s")
            reply = json.loads(self.ws.recv(timeout=left))
            if reply.get("id") != ident:
                continue  # an event
            if "error" in reply:
                raise BrowserError(f"{method}: {reply['error']}")
            return reply.get("result", {})

    def call(self, method: str, timeout: float = 60.0, **params: Any) -> dict:
        return self._call(method, self.session, timeout, **params)

    # ---- page ----------------------------------------------------------------------------------

    def resize(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                  mobile=False)

    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str) -> Any:
        out = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in out:
            raise BrowserError(f"{expression[:200]}: {out['exceptionDetails'].get('text')}")
        return out.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float = 60.0, what: str | None = None) -> Any:
        """Poll a JS expression until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(expression)
            except BrowserError:
                value = None
            if value:
                return value
            time.sleep(0.5)
        raise BrowserError(f"timed out after {timeout:.0f}s waiting for {what or expression[:200]}")

    def text(self) -> str:
        return self.evaluate("document.body ? document.body.innerText : ''") or ""

    def wait_text(self, needle: str, timeout: float = 60.0) -> None:
        self.wait_for(f"document.body && document.body.innerText.includes({json.dumps(needle)})", timeout,
                      what=f"the text {needle!r}")

    def click_at(self, x: float, y: float) -> None:
        """A real mouse click (move, press, release) at viewport coordinates."""
        self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
        self.call("Input.dispatchMouseEvent", type="mousePressed", x=x, y=y, button="left", clickCount=1)
        self.call("Input.dispatchMouseEvent", type="mouseReleased", x=x, y=y, button="left", clickCount=1)

    def click_text(self, text: str, selector: str = "*", timeout: float = 30.0, exact: bool = True) -> None:
        """Click (a real mouse click) the innermost visible element whose text is `text`."""
        where = self.wait_for(f"({self._find_js(text, selector, exact)})", timeout, what=f"a visible {text!r}")
        self.click_at(*where)

    def _find_js(self, text: str, selector: str, exact: bool) -> str:
        return f"""(() => {{
            const want = {json.dumps(text)};
            let best = null;
            for (const el of document.querySelectorAll({json.dumps(selector)})) {{
                const t = (el.innerText || el.textContent || '').trim();
                if (!({'t === want' if exact else 't.includes(want)'})) continue;
                const r = el.getBoundingClientRect();
                if (r.width === 0 || r.height === 0) continue;
                if (!best || best.contains(el)) best = el;
            }}
            if (!best) return null;
            best.scrollIntoView({{block: 'center', inline: 'center'}});
            const r = best.getBoundingClientRect();
            return [r.left + r.width / 2, r.top + r.height / 2];
        }})()"""

    def type_text(self, text: str) -> None:
        self.call("Input.insertText", text=text)

    def key(self, key: str, code: str | None = None, modifiers: int = 0) -> None:
        """Press and release one key (e.g. "Enter", "Escape", "a" with modifiers 2 = Ctrl)."""
        vk = {"Enter": 13, "Escape": 27, "Backspace": 8, "Tab": 9}.get(key, ord(key.upper()) if len(key) == 1 else 0)
        for kind in ("keyDown", "keyUp"):
            self.call("Input.dispatchKeyEvent", type=kind, key=key, code=code or key, modifiers=modifiers,
                      windowsVirtualKeyCode=vk)

    def screenshot(self, path: Path, full_page: bool = False) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": size[0], "height": size[1], "scale": 1})
        data = self.call("Page.captureScreenshot", timeout=120, **params)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    # ---- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        connection = getattr(self, "_connection", None)
        if connection is not None:
            try:
                connection.__exit__(None, None, None)
            except Exception:  # chromium already gone
                pass
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
