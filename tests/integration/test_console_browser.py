"""The web console in a real browser: Debian's headless Chromium, driven by Selenium
through Debian's chromedriver, against a real server on port 0 while the real client
ingests in a background thread.

It logs in (a wrong token first: refused), sees a collection's progress advance,
closes the collection, renders a 2-way marginal whose numbers equal what the gRPC
Query returns, downloads the CSV and finds it byte for byte what ``calmkit query
--format csv`` prints. Schema labels with markup are shown as text, never run. The
admin token appears in no URL visited, page source, cookie or log line.

With ``CALMKIT_SCREENSHOTS=DIR`` it saves ``DIR/console-collections.png`` and
``DIR/console-collection.png`` (the pictures in docs/operate.md).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from calmkit_aggregator.service.admin import AdminClient
from calmkit_client import Schema
from calmkit_client.cli import main
from calmkit_client.collector import Collector
from calmkit_client.device import DeviceState
from calmkit_client.schema import Attribute
from tests.integration.servers import IDS, POP, Server

TOKEN = "console-admin-token-7f3a9c2e51"
CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or DRIVER is None,
    reason="needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)",
)
webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

# POP's domain with labels a browser would run if they were not escaped
SCHEMA = Schema(
    (
        Attribute("a0", ("<script>document.title='owned'</script>", 'b & "c"')),
        *POP.schema.attributes[1:2],
        Attribute("<b>a2</b>", ("no", "yes")),
        *POP.schema.attributes[3:],
    )
)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[object]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-dev-shm-usage",
        "--window-size=1280,1400",
    ):
        options.add_argument(argument)
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    options.add_experimental_option(
        "prefs",
        {"download.default_directory": str(downloads), "download.prompt_for_download": False},
    )
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(DRIVER))
    driver.downloads = downloads
    try:
        yield driver
    finally:
        driver.quit()


class Visits:
    """Every URL the browser was on and every page source it got (for the leak check)."""

    def __init__(self, driver: object) -> None:
        self.driver = driver
        self.urls: list[str] = []
        self.sources: list[str] = []

    def open(self, url: str) -> None:
        self.driver.get(url)  # type: ignore[attr-defined]
        self.record()

    def record(self) -> None:
        self.urls.append(self.driver.current_url)  # type: ignore[attr-defined]
        self.sources.append(self.driver.page_source)  # type: ignore[attr-defined]


def _ingest(address: str, token: str, done: threading.Event) -> None:
    """All of POP in slices, paced so that ingest lasts a few seconds."""
    try:
        with Collector(address, "c1", token, DeviceState.in_memory(), batch_size=200) as client:
            for lo in range(0, POP.n, 300):
                client.submit_many(POP.codes[lo : lo + 300], IDS[lo : lo + 300])
                time.sleep(0.1)
    finally:
        done.set()


def _reports(driver: object) -> int:
    text = driver.find_element(By.CSS_SELECTOR, "#status .reports").text  # type: ignore[attr-defined]
    return int(text.replace(",", ""))


def _screenshot(driver: object, name: str) -> None:
    folder = os.environ.get("CALMKIT_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        height = driver.execute_script("return document.body.scrollHeight")  # type: ignore[attr-defined]
        driver.set_window_size(1280, max(700, int(height) + 200))  # type: ignore[attr-defined]
        driver.save_screenshot(str(Path(folder) / name))  # type: ignore[attr-defined]
        driver.set_window_size(1280, 1400)  # type: ignore[attr-defined]


def test_console_in_a_browser(
    browser: object,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    driver = browser
    visits = Visits(driver)
    started = time.perf_counter()
    with Server(
        tmp_path, TOKEN, console_address="127.0.0.1:0", console_sample_seconds=0.25
    ) as server:
        base = f"http://127.0.0.1:{server.console_port}"
        with AdminClient(server.address, TOKEN) as admin:
            info = admin.create_collection(
                SCHEMA, 1.0, POP.n, 3, collection_id="c1", seed=7, pilot=0.0
            )
        # not logged in: every page leads to the login form
        visits.open(f"{base}/collections/c1")
        assert driver.current_url == f"{base}/login"
        # a wrong token is refused
        driver.find_element(By.ID, "token").send_keys("wrong-token-wrong-token")
        driver.find_element(By.ID, "login").click()
        wait = WebDriverWait(driver, 20)
        error = wait.until(lambda d: d.find_elements(By.ID, "login-error"))
        visits.record()
        assert error[0].text == "wrong token"
        assert driver.get_cookies() == []
        visits.open(f"{base}/")
        assert driver.current_url == f"{base}/login"
        # the right one opens the console
        driver.find_element(By.ID, "token").send_keys(TOKEN)
        driver.find_element(By.ID, "login").click()
        wait.until(lambda d: d.current_url == f"{base}/")
        visits.record()
        (cookie,) = driver.get_cookies()
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        # ingest in the background; the collection page's progress advances
        done = threading.Event()
        worker = threading.Thread(target=_ingest, args=(server.address, info.submit_token, done))
        worker.start()
        try:
            visits.open(f"{base}/collections/c1")
            first = _reports(driver)

            def advanced(d: object) -> bool:
                visits.open(f"{base}/collections/c1")
                return _reports(d) > first

            WebDriverWait(driver, 30, poll_frequency=0.3).until(advanced)
            assert first < _reports(driver) <= POP.n
            visits.open(f"{base}/")
            rows = driver.find_elements(By.CSS_SELECTOR, "#collections tr")
            assert len(rows) == 2 and "c1" in rows[1].text and "open" in rows[1].text
            _screenshot(driver, "console-collections.png")
        finally:
            worker.join()
        assert done.is_set()
        with AdminClient(server.address, TOKEN) as admin:
            admin.close_collection("c1")
            expected = admin.query("c1", ["a0", "<b>a2</b>"])
        # pick a 2-way marginal in the form
        visits.open(f"{base}/collections/c1")
        assert driver.find_element(By.ID, "state").text == "closed"
        assert _reports(driver) == POP.n
        for name in ("a0", "<b>a2</b>"):
            driver.find_element(By.CSS_SELECTOR, f"input[name=attr][value='{name}']").click()
        driver.find_element(By.ID, "show").click()
        wait.until(lambda d: d.find_elements(By.ID, "marginal"))
        visits.record()
        assert driver.find_element(By.ID, "method").text == expected.method
        values, se = expected.values, np.sqrt(expected.variance)
        cells = driver.find_elements(By.CSS_SELECTOR, "#marginal g.cell")
        assert len(cells) == values.size == 4
        for cell in cells:
            i, j = int(cell.get_attribute("data-row")), int(cell.get_attribute("data-col"))
            shown = cell.find_elements(By.TAG_NAME, "text")
            assert shown[0].text == f"{values[i, j]:.4f}"
            assert shown[1].text == f"\u00b1 {se[i, j]:.4f}"
        rows = driver.find_elements(By.CSS_SELECTOR, "#cells tr")[1:]
        for row, cell in zip(rows, np.ndindex(values.shape)):
            tds = [td.text for td in row.find_elements(By.TAG_NAME, "td")]
            labels = [
                SCHEMA.attributes[0].categories[cell[0]],
                SCHEMA.attributes[2].categories[cell[1]],
            ]
            assert tds[:2] == labels  # markup shown as text
            assert tds[2:4] == [f"{values[cell]:.6g}", f"{se[cell]:.6g}"]
        assert driver.find_elements(By.TAG_NAME, "script") == []
        assert driver.title.startswith("collection c1")  # no injected script ran
        _screenshot(driver, "console-collection.png")
        # the CSV download is what `calmkit query --format csv` prints
        href = driver.find_element(By.ID, "csv").get_attribute("href")
        visits.urls.append(href)
        driver.find_element(By.ID, "csv").click()
        WebDriverWait(driver, 20).until(lambda d: list(driver.downloads.glob("*.csv")))
        (download,) = driver.downloads.glob("*.csv")
        token_file = tmp_path / "admin.token"
        token_file.write_text(TOKEN)
        token_file.chmod(0o600)
        capsys.readouterr()
        argv = ["query", "--address", server.address, "--token-file", str(token_file)]
        argv += ["--collection", "c1", "--attrs", "a0,<b>a2</b>", "--format", "csv"]
        assert main(argv) == 0
        assert download.read_text() == capsys.readouterr().out
        # log out: the session ends
        driver.find_element(By.CSS_SELECTOR, "header form button").click()
        wait.until(lambda d: d.current_url == f"{base}/login")
        visits.record()
        visits.open(f"{base}/")
        assert driver.current_url == f"{base}/login"
    elapsed = time.perf_counter() - started
    # the token is nowhere a browser or the log shows
    assert len(visits.urls) >= 10
    assert not [u for u in visits.urls if TOKEN in u]
    assert not [s for s in visits.sources if TOKEN in s]
    assert TOKEN not in cookie["value"] and TOKEN not in str(driver.get_cookies())
    # every log line of the process but the test driver's own (Selenium logs the keys
    # it types into the login form)
    lines = [r for r in caplog.records if not r.name.startswith(("selenium", "urllib3"))]
    assert [r for r in lines if r.name == "calmkit.aggregator" and '"console"' in r.getMessage()]
    assert not [r for r in lines if TOKEN in r.getMessage()]
    assert elapsed < 120
