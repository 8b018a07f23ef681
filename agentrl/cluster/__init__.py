"""Multi-machine placement with Ray; the only package that imports ``ray``.

Not yet built: the single-machine path (one process plus torchrun workers) is
the supported one today.
"""
