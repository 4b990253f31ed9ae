"""Producer wrappers shared by the GPU tests."""


class ViaDlpack:
    """Hides the C exchange API of the tensor it wraps: only ``__dlpack__`` and
    ``__dlpack_device__`` (the Python handshake), as a generic producer offers."""

    def __init__(self, t):
        self.t = t

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()

    def __dlpack__(self, **kw):
        return self.t.__dlpack__(**kw)
