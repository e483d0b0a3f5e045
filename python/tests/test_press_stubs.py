"""presses.pyi, the type stub of the generated press classes, is written by the build beside the
module from the classes the package generates: it is current (what the tool writes from the
registry now), valid Python, and states every class.
"""
import importlib.util
import os

import kvslim
from kvslim import presses as P

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_built_press_stub_is_current_and_states_every_class():
    spec = importlib.util.spec_from_file_location("press_stubs", os.path.join(ROOT, "tools", "press_stubs.py"))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    path = os.path.join(os.path.dirname(kvslim.__file__), "presses.pyi")
    with open(path, encoding="utf-8") as f:
        built = f.read()
    assert built == tool.stub_text(), f"{path} is not what tools/press_stubs.py writes from the package now"
    compile(built, path, "exec")
    for name in P.__all__:
        assert f"\nclass {name}(" in built or f"\nclass {name}:" in built, name
