"""python/kvslim/presses.pyi, the type stub of the generated press classes, is what
tools/press_stubs.py writes from the classes the package generates now: a press's registration
cannot change without its stub.
"""
import importlib.util
import os

from kvslim import presses as P

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_press_stub_is_what_the_tool_writes_now():
    spec = importlib.util.spec_from_file_location("press_stubs", os.path.join(ROOT, "tools", "press_stubs.py"))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    with open(tool.STUB, encoding="utf-8") as f:
        committed = f.read()
    assert committed == tool.stub_text(), "python/kvslim/presses.pyi is stale: run tools/press_stubs.py"
    compile(committed, tool.STUB, "exec")
    for name in P.__all__:
        assert f"\nclass {name}(" in committed or f"\nclass {name}:" in committed, name
