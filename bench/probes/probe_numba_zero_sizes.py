import numpy as np
from numba import cuda
def t(name, f):
    try:
        r = f(); print("OK   ", name, r if r is not None else "")
    except Exception as e:
        print("RAISE", name, type(e).__name__, str(e)[:160])
t("device_array(0)", lambda: cuda.device_array(0).shape)
t("pinned_array(0)", lambda: cuda.pinned_array(0).shape)
t("mapped_array(0)", lambda: cuda.mapped_array(0).shape)
t("managed_array(0)", lambda: cuda.managed_array(0).shape)
t("pinned(empty)", lambda: cuda.pinned(np.zeros(0)).__enter__())
t("mapped(empty)", lambda: cuda.mapped(np.zeros(0)).__enter__())
t("memhostalloc(0)", lambda: cuda.current_context().memhostalloc(0))
t("memalloc(0)", lambda: cuda.current_context().memalloc(0))
t("memallocmanaged(0)", lambda: cuda.current_context().memallocmanaged(0))
def pin_readonly():
    a = np.zeros(4096, np.uint8); a.setflags(write=False)
    with cuda.pinned(a): pass
t("pinned(readonly)", pin_readonly)
