"""Settings of lltm's CUDA library, in the manner of torch.backends.cudnn."""

benchmark = False
"""A bool that, if True, causes lltm to benchmark the CUDA sequence plans
(kernel families) of each new layer shape, and lltm.LLTM's schedule of its
stacked layers (one call a layer, one stacked launch, time chunks), and to
select the fastest where it clearly beats the one its rules pick
(lltm/_autotune.py; docs/design.md, "Measured plans")."""

cache_file = None
"""None, or a path: a JSON file of the plans :data:`benchmark` chose, keyed
by device name, then by [SM count, dtype, T rounded up to a power of two, B,
I, H, training, captured, torch's flags, layers at once] (a schedule's key
ends in "schedule" and its layers); read on first use, written after each
new measurement."""


def clear_cache() -> None:
    """Forgets every plan :data:`benchmark` measured or read: each shape is
    measured again, or read again from :data:`cache_file` (which is left as
    it is) where it is set."""
    from .. import _autotune
    _autotune.clear()
