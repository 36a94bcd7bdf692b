"""The generated site in a real browser: Debian's chromium and chromium-driver through selenium,
headless, over file:// URLs. `.ci/run` installs both, so CI never skips this."""

from __future__ import annotations

import io
import shutil

import numpy as np
import pytest

from gnomon.dash.site import write_site

from .conftest import ACCURACY, SLOW, STEADY, make_data

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="needs Debian's chromium and chromium-driver "
           "(apt-get install -y chromium chromium-driver; .ci/run installs them)")


@pytest.fixture(scope="module")
def site_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("browser") / "site"
    write_site(make_data(), out)
    return out


@pytest.fixture(scope="module")
def driver():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1280,1000", "--force-device-scale-factor=1"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    browser = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    browser.set_page_load_timeout(20)
    yield browser
    browser.quit()


def _load(driver, path):
    driver.get(path.resolve().as_uri())
    assert driver.execute_script("return document.readyState") == "complete"
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def _pixels(png: bytes) -> np.ndarray:
    from matplotlib import image

    rgb = image.imread(io.BytesIO(png), format="png")[..., :3]
    return rgb


def test_every_page_loads_without_errors_and_its_images_render(driver, site_dir):
    pages = sorted(site_dir.glob("*.html")) + sorted((site_dir / "bench").glob("*.html"))
    assert len(pages) == 8
    for page in pages:
        assert _load(driver, page) == [], page.name
        assert driver.title.endswith("gnomon dash")
        assert driver.execute_script(
            "return getComputedStyle(document.querySelector('header')).backgroundColor"
        ) == "rgb(36, 41, 47)", "style.css did not load"
        broken = driver.execute_script(
            "return Array.from(document.images)"
            ".filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src)")
        assert broken == [], page.name


def test_time_series_plot_renders(driver, site_dir):
    from selenium.webdriver.common.by import By

    page = next(p for p in (site_dir / "bench").glob("*.html")
                if "batch-8-" in p.name)
    assert _load(driver, page) == []
    assert driver.find_element(By.TAG_NAME, "h1").text == SLOW
    plot = driver.find_element(By.CSS_SELECTOR, "img.plot")
    assert plot.get_attribute("src").endswith(".svg")
    assert driver.execute_script("return arguments[0].naturalWidth", plot) > 100
    assert plot.size["width"] > 300 and plot.size["height"] > 100

    whole = _pixels(driver.get_screenshot_as_png())
    assert (whole.min(axis=2) < 0.9).mean() > 0.01, "the page screenshot is blank"
    shot = _pixels(plot.screenshot_as_png)
    assert (shot.min(axis=2) < 0.9).mean() > 0.01, "the plot is blank"
    r, g, b = shot[..., 0], shot[..., 1], shot[..., 2]
    blue = (b > 0.6) & (r < 0.3) & (g < 0.5)  # the median line, #0b57d0
    red = (r > 0.7) & (g < 0.3) & (b < 0.3)  # the open step's marker, #d1242f
    assert blue.sum() > 200, "no median line in the plot"
    assert red.sum() > 50, "no regression marker in the plot"


def test_accuracy_page_renders_its_series_with_the_noise_band(driver, site_dir):
    from selenium.webdriver.common.by import By

    assert _load(driver, site_dir / "accuracy.html") == []
    sections = driver.find_elements(By.CSS_SELECTOR, "section.accuracy-series")
    assert [s.find_element(By.TAG_NAME, "h2").text for s in sections] == [ACCURACY]
    rows = sections[0].find_elements(By.CSS_SELECTOR, "tbody tr")
    assert len(rows) == 6 and rows[4].text.endswith("moved")  # the planted 6% -> 12% move
    plot = sections[0].find_element(By.CSS_SELECTOR, "img.plot")
    assert driver.execute_script("return arguments[0].naturalWidth", plot) > 100
    shot = _pixels(plot.screenshot_as_png)
    r, g, b = shot[..., 0], shot[..., 1], shot[..., 2]
    assert ((b > 0.6) & (r < 0.3) & (g < 0.5)).sum() > 200, "no value line in the plot"
    band = (b > 0.85) & (r > 0.75) & (r < 0.95) & (g > 0.8)  # the light blue noise band
    assert band.sum() > 500, "no noise-floor band in the plot"
    assert ((r > 0.7) & (g < 0.3) & (b < 0.3)).sum() > 50, "no marker where it moved"


def test_planted_regression_is_listed_and_links_to_its_page(driver, site_dir):
    from selenium.webdriver.common.by import By

    assert _load(driver, site_dir / "index.html") == []
    rows = driver.find_elements(By.CSS_SELECTOR, "#regressions tbody tr")
    assert len(rows) == 1
    cells = [c.text for c in rows[0].find_elements(By.TAG_NAME, "td")]
    assert cells[0] == SLOW and "+15.0%" in cells and "open" in cells
    listed = [c.text for c in driver.find_elements(By.CSS_SELECTOR, "#benchmarks td.key")]
    assert sorted(listed) == sorted([SLOW, STEADY])
    sparks = driver.find_elements(By.CSS_SELECTOR, "#benchmarks svg.spark")
    assert len(sparks) == 2 and all(s.size["width"] > 0 for s in sparks)

    rows[0].find_element(By.TAG_NAME, "a").click()
    assert driver.find_element(By.TAG_NAME, "h1").text == SLOW
    assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []

    assert _load(driver, site_dir / "compare.html") == []
    flagged = driver.find_elements(By.CSS_SELECTOR, "tr.verdict-REGRESSION td.key")
    assert [c.text for c in flagged] == [SLOW]
    colour = driver.execute_script(
        "return getComputedStyle(document.querySelector('tr.verdict-REGRESSION'))"
        ".backgroundColor")
    assert colour == "rgb(253, 232, 231)", "the regression row is not highlighted"


def test_site_from_a_fixture_database_lists_its_planted_regression(driver, tmp_path):
    """The path the issue names: a database with a planted regression, through the store's
    site_data, written and opened in the browser."""
    from selenium.webdriver.common.by import By

    from dash.synthetic import KEYS, document, sha, write
    from gnomon.dash import ingest, open_engine, site_data

    slow = next(iter(KEYS))
    files = [write(document(sha(f"commit-{i}"), runs=5, factors={slow: 1.15 if i >= 4 else 1.0}),
                   tmp_path / f"c{i}.json") for i in range(8)]
    engine = open_engine(f"sqlite:///{tmp_path / 'bench.sqlite'}")
    ingest(engine, files)
    site = tmp_path / "site"
    write_site(site_data(engine), site)

    assert _load(driver, site / "index.html") == []
    rows = driver.find_elements(By.CSS_SELECTOR, "#regressions tbody tr")
    assert [row.find_elements(By.TAG_NAME, "td")[0].text for row in rows] == [slow]
