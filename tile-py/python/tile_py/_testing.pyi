from typing import Any, Optional, Sequence, Tuple

from . import Param

def after_fork_in_child() -> None: ...
def check_args(
    params: Sequence[Param],
    args: Sequence[Any],
    *,
    stream: Any = ...,
    device: int = 0,
    sync: bool = True,
    consume: bool = True,
    grid: Optional[Any] = None,
    block: Optional[Any] = None,
) -> None: ...
def debug_counters() -> dict[str, int]: ...
def exchange_api_cost(obj: Any, n: int = 64) -> tuple[float, float]: ...
def pack_args(
    params: Sequence[Param],
    args: Sequence[Any],
    *,
    stream: Any = ...,
    device: int = 0,
) -> list[int]: ...
def queue_release(obj: Any) -> None: ...
def release_thread() -> dict[str, int | bool]: ...
def shutdown(timeout: float = 5.0) -> int: ...
def xla_roles(
    params: Sequence[Param], roles: Optional[Sequence[Any]] = None
) -> Tuple[int, int, int, list[Tuple[str, int, Optional[int]]]]: ...
