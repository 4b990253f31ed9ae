"""The exit hook with an infinite or huge timeout waits without a panic."""

import os
import subprocess
import sys
import textwrap

HERE = os.path.dirname(__file__)


# ---- _shutdown with an infinite or huge timeout ------------------------------------------


def test_shutdown_with_infinite_or_huge_timeout_does_not_panic():
    # _shutdown stops tile_py for good: run it in a child.
    code = textwrap.dedent("""
        import tile_py
        from tile_py import _testing
        for t in (float("inf"), 1e300, -5.0):
            assert _testing.shutdown(t) == 0, t
        try:
            _testing.shutdown(float("nan"))
        except ValueError:
            print("nan refused")
        print("ok")
    """)
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert "nan refused" in r.stdout and "ok" in r.stdout
    assert "panicked" not in r.stderr
