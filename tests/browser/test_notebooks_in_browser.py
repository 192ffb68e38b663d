"""Every chapter in JupyterLab, in a real (headless) Chromium, as a reader opens and runs it.

Per notebook: it opens without being marked modified and its recorded outputs render (every
picture drawn, no plain-text widget repr). A chapter with widgets is then run as a reader runs
it, in the kernel JupyterLab starts for it (the one kernel every chapter asks for): Run All
Cells finishes with no error output; every widget renders (no "Loading widget…"); moving each
slider and pressing each button changes what the widget shows; the interview quiz reveals an
answer. nbval cannot see any of this: it never renders a widget. Running the chapters without
widgets here again would repeat nbval's work (it runs every cell of every chapter in a kernel
and compares each output with the recorded one) and add nothing a reader sees. A screenshot
per chapter lands in tests/browser/results/ (kept for failures and for a look at what a reader
sees).
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"

NOTEBOOKS = sorted(path.name for path in (ROOT / "notebooks").glob("*.ipynb"))
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def has_widgets(name: str) -> bool:
    """Whether the committed chapter shows a widget (a reader moves it: it needs a live kernel)."""
    notebook = json.loads((ROOT / "notebooks" / name).read_text())
    return any(WIDGET_MIME in output.get("data", {}) for cell in notebook["cells"]
               for output in cell.get("outputs", []))


INTERACTIVE = [name for name in NOTEBOOKS if has_widgets(name)]
STATIC = [name for name in NOTEBOOKS if name not in INTERACTIVE]
RUN_TIMEOUT = 240          # seconds for Run All Cells on one chapter (each takes 10-40 s here)
WIDGET_REPR = re.compile(
    r"^(VBox|HBox|Box|interactive|IntSlider|FloatSlider|Button|Output|Dropdown)\(")


def _by():
    from selenium.webdriver.common.by import By

    return By


def wait_for(condition, timeout: float, what: str, poll: float = 0.5):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def kernel_status(driver) -> str | None:
    found = driver.find_elements(_by().CSS_SELECTOR, ".jp-NotebookPanel:not(.lm-mod-hidden) "
                                                      ".jp-Notebook-ExecutionIndicator")
    return found[0].get_attribute("data-status") if found else None


def tab_classes(driver, name: str) -> str:
    for tab in driver.find_elements(_by().CSS_SELECTOR, ".lm-TabBar-tab"):
        if tab.text.strip() == name:
            return tab.get_attribute("class")
    return ""


def click_menu(driver, menu: str, item: str) -> None:
    By = _by()
    for entry in driver.find_elements(By.CSS_SELECTOR, ".lm-MenuBar-item"):
        if entry.text.strip() == menu:
            entry.click()
            break
    else:
        raise AssertionError(f"no {menu!r} menu in JupyterLab's menu bar")
    option = wait_for(lambda: [e
                               for e in driver.find_elements(By.CSS_SELECTOR, ".lm-Menu-itemLabel")
                               if e.text.strip() == item], 10, f"the menu item {item!r}")
    option[0].click()


def prompts(driver) -> list[str]:
    return [p.text.strip() for p in driver.find_elements(
        _by().CSS_SELECTOR,
        ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell " ".jp-InputArea-prompt")]


def run_all(driver) -> None:
    """Run All Cells, then wait until the kernel is idle and no cell is running or queued."""
    click_menu(driver, "Run", "Run All Cells")
    time.sleep(2)
    settled = {"since": None}

    def finished():
        busy = kernel_status(driver) != "idle" or any(p == "[*]:" for p in prompts(driver))
        if busy:
            settled["since"] = None
            return False
        settled["since"] = settled["since"] or time.time()
        return time.time() - settled["since"] > 2          # idle for two seconds in a row

    wait_for(finished, RUN_TIMEOUT, "Run All Cells to finish")


def save(driver, name: str) -> None:
    from selenium.webdriver import ActionChains
    from selenium.webdriver.common.keys import Keys

    ActionChains(driver).key_down(Keys.CONTROL).send_keys("s").key_up(Keys.CONTROL).perform()
    wait_for(lambda: "jp-mod-dirty" not in tab_classes(driver, name), 20, f"{name} to be saved")


def widget_container(element):
    """The outermost widget around `element` (the whole interactive thing a reader sees)."""
    return element.find_element(_by().XPATH,
                                "./ancestor::div[contains(@class, 'jp-OutputArea-output')][1]")


def picture(container) -> str:
    images = container.find_elements(_by().TAG_NAME, "img")
    return images[0].get_attribute("src") if images else ""


def check_widgets(driver, name: str) -> list[str]:
    """Move every slider and press every button; return what went wrong."""
    from selenium.webdriver.common.keys import Keys

    By = _by()
    problems = []
    for slider in driver.find_elements(By.CSS_SELECTOR,
                                       ".jp-NotebookPanel:not(.lm-mod-hidden) .widget-slider"):
        label = slider.find_element(By.CSS_SELECTOR, ".widget-label")
        text = label.text.strip()
        if driver.execute_script("return arguments[0].scrollWidth > arguments[0].clientWidth + 1;",
                                 label):
            problems.append(f"the slider label {text!r} is cut off")
        for element in (label, slider):
            if (element.get_attribute("title") or "").strip() == "null":
                problems.append(f"the slider {text!r} has the tooltip 'null'")
        container = widget_container(slider)
        before = picture(container)
        if not before:
            problems.append(f"the widget with the slider {text!r} draws no picture")
            continue
        handle = slider.find_element(By.CSS_SELECTOR, ".noUi-handle")
        handle.click()
        handle.send_keys(Keys.ARROW_RIGHT)
        try:
            wait_for(lambda c=container, b=before: picture(c) not in ("", b), 60,
                     f"the picture to change after {text!r}")
        except AssertionError:
            problems.append(f"moving the slider {text!r} did not change the picture")
    for button in driver.find_elements(By.CSS_SELECTOR,
                                       ".jp-NotebookPanel:not(.lm-mod-hidden) .widget-button"):
        text = button.text.strip()
        if (button.get_attribute("title") or "").strip() == "null":
            problems.append(f"the button {text!r} has the tooltip 'null'")
        container = widget_container(button)
        before = container.text
        button.click()
        try:
            wait_for(lambda c=container, b=before: c.text != b, 20,
                     f"the widget to change after {text!r}")
        except AssertionError:
            problems.append(f"pressing {text!r} changed nothing")
    return problems


PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"
UNDRAWN_IMAGES = """return Array.from(arguments[0].querySelectorAll('.jp-OutputArea-output img'))
    .filter(img => !img.complete || img.naturalWidth === 0).length;"""


APP_READY = "return !!(window.jupyterapp && window.jupyterapp.commands);"
CLOSE_ALL = """const done = arguments[arguments.length - 1];
window.jupyterapp.commands.execute('application:close-all')
    .then(() => done(true), () => done(false));"""
OPEN = """const [path, done] = arguments;
window.jupyterapp.commands.execute('docmanager:open', {path})
    .then(() => done(true), () => done(false));"""


def close_all(driver) -> None:
    """Close every tab of a page that JupyterLab has loaded (before its kernels are shut down,
    so no open chapter is left with a dead kernel's dialog for the next one)."""
    with contextlib.suppress(Exception):
        if driver.execute_script(APP_READY):
            driver.execute_async_script(CLOSE_ALL)
            wait_for(lambda: not driver.find_elements(_by().CSS_SELECTOR, ".jp-NotebookPanel"),
                     10, "every tab to close")


def open_chapter(driver, lab, name: str, kernel: bool = True) -> list[str]:
    """Open `name` and, with `kernel`, wait for its kernel to start; return what went wrong. A
    chapter that is run opens in a fresh load of JupyterLab with a fresh workspace. A chapter
    that is only looked at opens in the JupyterLab page already loaded, once the last chapter's
    tabs are closed (JupyterLab's own open command: a reader's double click in the file
    browser), and needs no live kernel: every chapter starts the same one, and the chapters
    that are run below prove it starts."""
    By = _by()
    problems = []
    reuse = (not kernel and driver.current_url.startswith(lab.url)
             and driver.execute_script(APP_READY)
             and not driver.find_elements(By.CSS_SELECTOR, ".jp-NotebookPanel, .jp-Dialog"))
    if reuse:
        driver.set_script_timeout(60)
        if not driver.execute_async_script(OPEN, name):
            problems.append("JupyterLab's open command failed")
    else:
        # ?reset: a fresh workspace, so no tab (or kernel) of an earlier chapter comes back
        driver.get(f"{lab.url}/lab/tree/{name}?reset&token={lab.token}")
    wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, f"{PANEL} .jp-Cell"), 60,
             f"{name} to open")
    wait_for(lambda: tab_classes(driver, name), 10, f"{name}'s tab")
    if kernel:
        wait_for(lambda: kernel_status(driver) == "idle", 60, "the kernel to start")
    else:   # its session exists, so the shutdown after the checks stops the kernel it starts
        wait_for(lambda: lab.api("GET", "/api/sessions"), 30, "the notebook's session")
    time.sleep(1)
    if "jp-mod-dirty" in tab_classes(driver, name):
        problems.append("the notebook shows as modified right after opening")
    return problems


def widget_reprs(driver) -> list[str]:
    """Outputs that show a widget as its plain-text repr instead of drawing it."""
    return [f"a widget shows as plain text: {output.text.strip()[:60]!r}"
            for output in driver.find_elements(
                _by().CSS_SELECTOR, f"{PANEL} .jp-OutputArea-output[data-mime-type='text/plain']")
            if WIDGET_REPR.match(output.text.strip())]


def test_widget_chapters_are_found():
    """The run below covers the chapters whose recorded outputs hold a widget: chapter 03's
    knobs and the interview's quiz at least, so a change to how widgets are recorded cannot
    leave every widget untested."""
    assert {"03_continuous_batching.ipynb", "interview.ipynb"} <= set(INTERACTIVE), INTERACTIVE


@contextlib.contextmanager
def checked_in_lab(browser, lab, name: str):
    """Run a chapter's checks: the body appends what it finds wrong to the list it is given.
    A screenshot of the chapter is kept (a `-failure` one when anything went wrong), the
    kernels are shut down whatever happened, and the problems fail the test together."""
    RESULTS.mkdir(exist_ok=True)
    shot = RESULTS / f"{Path(name).stem}.png"
    failure = RESULTS / f"{Path(name).stem}-failure.png"
    problems: list[str] = []
    try:
        yield problems
        browser.save_screenshot(str(failure if problems else shot))
    except Exception:
        browser.save_screenshot(str(failure))
        raise
    finally:
        close_all(browser)
        lab.shut_down_kernels()
    assert not problems, f"{name} in JupyterLab (screenshot {failure}):\n  " + \
        "\n  ".join(problems)


@pytest.mark.parametrize("name", STATIC)
def test_the_chapter_opens_with_its_outputs_drawn_in_jupyterlab(lab, browser, name):
    By = _by()
    with checked_in_lab(browser, lab, name) as problems:
        problems += open_chapter(browser, lab, name, kernel=False)
        panel = browser.find_element(By.CSS_SELECTOR, PANEL)
        notebook = json.loads((lab.folder / name).read_text())
        recorded = sum("image/png" in output.get("data", {}) for cell in notebook["cells"]
                       for output in cell.get("outputs", []))
        drawn = len(panel.find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output img"))
        if drawn < recorded:
            problems.append(f"{recorded} pictures are recorded, {drawn} are shown")
        try:
            wait_for(lambda: browser.execute_script(UNDRAWN_IMAGES, panel) == 0, 10,
                     "every picture to load")
        except AssertionError:
            problems.append(f"{browser.execute_script(UNDRAWN_IMAGES, panel)} pictures did "
                            "not load")
        problems += widget_reprs(browser)


@pytest.mark.parametrize("name", INTERACTIVE)
def test_the_chapter_runs_and_its_widgets_work_in_jupyterlab(lab, browser, name):
    By = _by()
    with checked_in_lab(browser, lab, name) as problems:
        problems += open_chapter(browser, lab, name)
        run_all(browser)
        body = browser.find_element(By.CSS_SELECTOR, PANEL).text
        if "Loading widget" in body:
            problems.append("a widget never rendered ('Loading widget…')")
        problems += widget_reprs(browser)
        problems += check_widgets(browser, name)
        save(browser, name)
        notebook = json.loads((lab.folder / name).read_text())
        code = [cell for cell in notebook["cells"] if cell["cell_type"] == "code"
                and cell["source"]]
        not_run = [i for i, cell in enumerate(code) if cell.get("execution_count") is None]
        if not_run:
            problems.append(f"{len(not_run)} code cells did not run (the first: code cell "
                            f"{not_run[0] + 1})")
        for index, cell in enumerate(code):
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    problems.append(f"code cell {index + 1} raised {output['ename']}: "
                                    f"{output['evalue'][:200]}")
