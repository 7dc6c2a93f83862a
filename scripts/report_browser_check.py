"""Open `palestra report` pages in headless Chromium and report what a reader's browser would say.

    python scripts/report_browser_check.py report-abc12345/index.html [more pages ...]
    python scripts/report_browser_check.py --self-test     # a broken page must fail the check

For each page it prints the console messages, the images that did not decode and any resource
fetched from outside the file, and exits 1 if there is any of these (2 without Chromium: install
the system package, `apt-get install chromium`). The page itself has no scripts; the check loads
a copy, in an empty folder, with one probe script appended that counts the images that decoded
and lists what the page fetched — so a page that leans on a file beside it fails here, as it
would for a reader who was sent only the page.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PROBE_TAG = "palestra-check"
PROBE = f"""<script>
window.addEventListener("load", () => {{
  const images = [...document.images];
  const broken = images.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.alt || i.src.slice(0, 60));
  const fetched = performance.getEntriesByType("resource").map(e => e.name).filter(n => !n.startsWith("data:"));
  console.log("{PROBE_TAG} " + JSON.stringify({{images: images.length, broken, fetched}}));
}});
</script>"""
CONSOLE = re.compile(r":CONSOLE[^\]]*\] (.*)$")
BROKEN_PAGE = ('<!doctype html><html><head><title>broken</title></head><body>'
               '<img src="beside.png" alt="a file beside the page"><script>undefinedCall();</script></body></html>')


def chromium() -> str | None:
    return next((found for name in ("chromium", "chromium-browser", "google-chrome")
                 if (found := shutil.which(name))), None)


def check(page: Path, browser: str, timeout: float = 60.0) -> list[str]:
    """The problems Chromium reports for ``page`` (empty: none)."""
    import json

    text = page.read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "page.html"
        copy.write_text(text.replace("</body>", PROBE + "</body>") if "</body>" in text else text + PROBE,
                        encoding="utf-8")
        run = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                              "--enable-logging=stderr", "--v=0", f"--user-data-dir={tmp}/profile",
                              "--virtual-time-budget=10000", "--dump-dom", copy.as_uri()],
                             capture_output=True, text=True, timeout=timeout)
    messages = [m.group(1) for line in run.stderr.splitlines() if (m := CONSOLE.search(line))]
    probes = [m for m in messages if m.startswith(f'"{PROBE_TAG} ')]
    problems = [f"console: {m}" for m in messages if m not in probes]
    if not probes:
        return problems + [f"the page did not finish loading (chromium exit {run.returncode})"]
    found = json.loads(probes[0][len(PROBE_TAG) + 2:].split('", source:')[0].replace('\\"', '"'))
    problems += [f"image did not decode: {name}" for name in found["broken"]]
    problems += [f"fetched from outside the page: {url}" for url in found["fetched"]]
    if not problems:
        print(f"{page}: {found['images']} images decoded, no console messages, nothing fetched")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pages", nargs="*", type=Path)
    parser.add_argument("--self-test", action="store_true", help="check that a broken page fails")
    args = parser.parse_args(argv)
    browser = chromium()
    if browser is None:
        print("no Chromium found: apt-get install chromium", file=sys.stderr)
        return 2
    if args.self_test:
        with tempfile.TemporaryDirectory() as tmp:
            page = Path(tmp) / "broken.html"
            page.write_text(BROKEN_PAGE, encoding="utf-8")
            problems = check(page, browser)
        caught = any("undefinedCall" in p for p in problems) and any("did not decode" in p for p in problems)
        print("self-test: " + ("a broken page's script error and its image kept beside it were both reported"
                               if caught else f"MISSED problems of a broken page; got {problems}"))
        if not caught:
            return 1
    failed = 0
    for page in args.pages:
        problems = check(page, browser) if page.is_file() else ["no such file"]
        for problem in problems:
            print(f"{page}: {problem}")
        failed += bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
