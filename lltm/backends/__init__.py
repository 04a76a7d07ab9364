"""lltm's backend settings, in the manner of torch.backends: ``lltm.backends.cuda``."""
from . import cuda  # noqa: F401
