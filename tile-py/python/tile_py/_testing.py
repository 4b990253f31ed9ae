"""Test and benchmark hooks of tile_py: not part of its API, and not for use outside its own
tests, benchmarks and profile harness.

- ``check_args(params, args, *, stream=None, device=0, sync=True, consume=True, grid=None,
  block=None)``: a launch's conversion and checks without a device.
- ``pack_args(params, args, *, stream=None, device=0)``: the kernel parameter values a launch
  would pass; nothing consumed.
- ``debug_counters()``: tile_py's own counters.
- ``exchange_api_cost(obj, n=64)``: what a producer's DLPack C exchange API export costs.
- ``release_thread()``, ``queue_release(obj)``: the release thread's state; a release queued as
  a launch's guard queues it.
- ``hold_release_queue_lock(seconds)``: the release queue's lock held on another thread for
  ``seconds``, as a thread releasing a detached launch's tensors holds it.
- ``shutdown(timeout=5.0)``, ``after_fork_in_child()``: the process hooks, run by hand.
- ``xla_roles(params, roles=None)``: the XLA handler's parameter roles.
"""

from ._tile_py import _testing as _hooks

after_fork_in_child = _hooks.after_fork_in_child
check_args = _hooks.check_args
debug_counters = _hooks.debug_counters
exchange_api_cost = _hooks.exchange_api_cost
hold_release_queue_lock = _hooks.hold_release_queue_lock
pack_args = _hooks.pack_args
queue_release = _hooks.queue_release
release_thread = _hooks.release_thread
shutdown = _hooks.shutdown
xla_roles = _hooks.xla_roles

del _hooks
