"""The page of `trellis serve` in headless Chromium, through its WebDriver (Selenium).

Run by tests/all/serve_browser.rs, which starts the servers: reads {"demo": URL, "agents":
URL, "ask": URL, "screenshots": DIR, "query": TEXT, "chromium": PATH, "driver": PATH} on
stdin, and
exits non-zero (with the step that failed) when the page does not do what an operator needs:

- demo (the builder-demo example, its replay cassette): the page loads with the plan graph,
  a builder message streams in (tool calls one by one before the reply), the step the
  builder adds appears in the graph and turns completed, and it reads at 390 px wide;
- agents (a workflow whose steps' model is a fake): a step started from the page shows its
  tool calls and its end in the executions panel, and a second one is stopped from it;
- ask (a workflow of two human_input steps): the whole workflow started from the page waits
  on each question in the executions panel, is answered there (a yes button, then a text
  answer) and ends done; its schedule is enabled from the Schedules tab and fired by hand,
  the firing and its outcome shown in the schedule's history.

Screenshots (desktop 1280x800 and narrow 390x844) go to DIR.
"""

import json
import os
import sys
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

args = json.load(sys.stdin)
shots = args["screenshots"]
os.makedirs(shots, exist_ok=True)

options = webdriver.ChromeOptions()
options.binary_location = args["chromium"]
for flag in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--window-size=1280,800", "--no-first-run", "--disable-extensions"]:
    options.add_argument(flag)
driver = webdriver.Chrome(service=Service(executable_path=args["driver"]), options=options)
driver.set_window_size(1280, 800)


def fail(step, detail=""):
    driver.save_screenshot(os.path.join(shots, "failed.png"))
    log = driver.execute_script(
        "return [...document.querySelectorAll('.ev, .exec')].map(e => e.innerText).join('\\n')")
    print(f"FAILED: {step}: {detail}\n--- the page's log and executions:\n{log}", file=sys.stderr)
    driver.quit()
    sys.exit(1)


def wait(step, check, timeout=90):
    """Waits until check() is truthy; fails naming the step."""
    end = time.time() + timeout
    last = None
    while time.time() < end:
        try:
            value = check()
            if value:
                return value
        except Exception as e:  # the element is not there yet
            last = e
        time.sleep(0.05)
    fail(step, f"not within {timeout} s ({last})")


def node(step_id):
    found = driver.find_elements(By.CSS_SELECTOR, f'#graph g.node[data-step="{step_id}"]')
    return found[0] if found else None


def click_fresh(step, selector):
    """Finds `selector` and clicks it, again while the panel redraws under it."""
    def go():
        driver.find_element(By.CSS_SELECTOR, selector).click()
        return True
    wait(step, go)


def type_fresh(step, selector, text):
    """Types `text` into the field at `selector`, again while the panel redraws under it."""
    def go():
        field = driver.find_element(By.CSS_SELECTOR, selector)
        field.clear()
        field.send_keys(text)
        return driver.find_element(By.CSS_SELECTOR, selector).get_attribute("value") == text
    wait(step, go)


def click(element):
    driver.execute_script(
        "arguments[0].dispatchEvent(new MouseEvent('click', {bubbles: true}))", element)


def no_sideways_scroll(step):
    width = driver.execute_script("return document.documentElement.scrollWidth")
    inner = driver.execute_script("return window.innerWidth")
    if width > inner + 1:
        fail(step, f"the page is {width} px wide in a {inner} px window")


# ---- the builder-demo example: chat, streaming, the graph ----
driver.get(args["demo"])
wait("the plan is drawn", lambda: "no steps yet" in
     driver.find_element(By.ID, "graph").get_attribute("innerHTML"))
driver.save_screenshot(os.path.join(shots, "desktop-start.png"))
box = driver.find_element(By.ID, "query")
box.send_keys(args["query"])
driver.find_element(By.CSS_SELECTOR, "#ask button").click()

# Streaming: the page shows the turn's events as they come, so the count of lines is seen
# growing in several steps before the reply that ends the session's turns is there.
counts = set()
def final_reply():
    lines = driver.find_elements(By.CSS_SELECTOR, "#log .ev")
    counts.add(len(lines))
    return any("22 in all" in l.text for l in lines if l.get_attribute("data-type") == "text")
wait("the builder's reply", final_reply, timeout=180)
if len([c for c in counts if c > 0]) < 3:
    fail("the reply streamed in", f"the log was seen with only these line counts: {sorted(counts)}")
tools = [e.get_attribute("data-tool") for e in
         driver.find_elements(By.CSS_SELECTOR, '#log .ev[data-type="tool_ended"]')]
if "add_scripted_step" not in tools or "execute_step" not in tools:
    fail("the tool calls are shown", f"tool_ended lines: {tools}")
wait("the new step is in the graph", lambda: node("count-words"))
wait("the new step's last run is completed",
     lambda: node("count-words").get_attribute("data-status") == "completed")
# The builder's executions are in the executions panel too.
wait("the builder's first execution ends failed in the panel",
     lambda: driver.find_element(By.CSS_SELECTOR, '.exec[data-execution="exec-count-words-1"]')
     .get_attribute("data-status") == "failed")
wait("the builder's second execution ends done in the panel",
     lambda: driver.find_element(By.CSS_SELECTOR, '.exec[data-execution="exec-count-words-2"]')
     .get_attribute("data-status") == "done")
click(node("count-words"))
wait("the step panel shows the grant",
     lambda: "read-write" in driver.find_element(By.CSS_SELECTOR, '#tab-body').text)
driver.save_screenshot(os.path.join(shots, "desktop-builder.png"))
no_sideways_scroll("desktop")
driver.set_window_size(390, 844)
time.sleep(0.3)
no_sideways_scroll("narrow")
driver.save_screenshot(os.path.join(shots, "narrow-builder.png"))
driver.set_window_size(1280, 800)

# ---- executions from the page: tool calls and the end, and a stop ----
driver.get(args["agents"])
wait("the agents' plan is drawn", lambda: node("greet") and node("slow"))
click(node("greet"))
run = wait("the step panel has a run button", lambda: [
    b for b in driver.find_elements(By.CSS_SELECTOR, "#tab-body button") if b.text == "Run this step"])
run[0].click()
row = '.exec[data-execution="exec-greet-1"]'
wait("the execution ends done", lambda: driver.find_element(By.CSS_SELECTOR, row)
     .get_attribute("data-status") == "done")
lines = driver.find_element(By.CSS_SELECTOR, row + " .lines").text
if "tool workspace:list_dir (" not in lines:
    fail("the execution's tool calls are shown", lines)
wait("the graph shows greet completed", lambda: node("greet").get_attribute("data-status") == "completed")
click(node("slow"))
run = wait("the slow step's run button", lambda: [
    b for b in driver.find_elements(By.CSS_SELECTOR, "#tab-body button")
    if b.text == "Run this step" and
    driver.find_element(By.CSS_SELECTOR, "#tab-body [data-step]").get_attribute("data-step") == "slow"])
run[0].click()
slow = '.exec[data-execution="exec-slow-1"]'
wait("the slow step runs a tool", lambda: "tool workspace:list_dir (" in
     driver.find_element(By.CSS_SELECTOR, slow + " .lines").text)
click_fresh("the stop button is clicked", slow + ' button[data-stop="exec-slow-1"]')
wait("the stopped execution ends cancelled", lambda: driver.find_element(By.CSS_SELECTOR, slow)
     .get_attribute("data-status") == "cancelled")
driver.save_screenshot(os.path.join(shots, "desktop-executions.png"))
driver.set_window_size(390, 844)
time.sleep(0.3)
no_sideways_scroll("narrow executions")
driver.save_screenshot(os.path.join(shots, "narrow-executions.png"))
driver.set_window_size(1280, 800)

# ---- human inputs answered from the page ----
driver.get(args["ask"])
wait("the ask plan is drawn", lambda: node("approve") and node("name"))
driver.find_element(By.ID, "run-all").click()
ask = '.exec[data-execution="workflow-full-1"] form.ask'
yes = wait("the first question waits in the panel", lambda: driver.find_element(
    By.CSS_SELECTOR, ask + ' button[data-answer="yes"]'))
if "Ship it?" not in driver.find_element(By.CSS_SELECTOR, ask).text:
    fail("the question is shown", driver.find_element(By.CSS_SELECTOR, ask).text)
click_fresh("yes is clicked", ask + ' button[data-answer="yes"]')
answer = wait("the second question takes a text answer", lambda: driver.find_element(
    By.CSS_SELECTOR, ask + ' input[aria-label="answer"]'))
if "Release name?" not in driver.find_element(By.CSS_SELECTOR, ask).text:
    fail("the second question is shown", driver.find_element(By.CSS_SELECTOR, ask).text)
driver.save_screenshot(os.path.join(shots, "desktop-input.png"))
type_fresh("the answer is typed", ask + ' input[aria-label="answer"]', "v2")
click_fresh("the answer is sent", ask + " button")
wait("the answered workflow ends done", lambda: driver.find_element(
    By.CSS_SELECTOR, '.exec[data-execution="workflow-full-1"]').get_attribute("data-status") == "done")
wait("the graph shows name completed", lambda: node("name").get_attribute("data-status") == "completed")

# ---- schedules: enabled from the page, then fired by hand, the firing in its history ----
driver.find_element(By.CSS_SELECTOR, '.tabs button[data-tab="schedules"]').click()
row = '.exec[data-schedule="nightly"]'
wait("the schedule is listed, off", lambda: "off" in driver.find_element(By.CSS_SELECTOR, row + " .top").text)
click_fresh("enable is clicked", row + ' button[data-action="enable"]')
wait("the schedule is on with its next firing", lambda: "next: 20" in driver.find_element(By.CSS_SELECTOR, row).text
     and "on" in driver.find_element(By.CSS_SELECTOR, row + " .top").text)
click_fresh("run now is clicked", row + ' button[data-action="trigger"]')


def fired():
    driver.find_element(By.CSS_SELECTOR, '.tabs button[data-tab="schedules"]').click()
    time.sleep(0.3)
    return "manual" in driver.find_element(By.CSS_SELECTOR, row + " .lines").text and \
        "running" not in driver.find_element(By.CSS_SELECTOR, row + " .lines").text


wait("the manual firing and its outcome are in the schedule's history", fired)
driver.save_screenshot(os.path.join(shots, "desktop-schedules.png"))
driver.quit()
print("ok")
