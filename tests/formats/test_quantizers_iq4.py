"""IQ4_NL / IQ4_XS's compiled search (formats/quant_fit_iq4.py) against its NumPy twin
(formats/quantizers_iq4.py): the same scales and codes, bit for bit, with and without weights.
(Both against ggml: tests/formats/test_quants.py, tests/models/test_codebook_types.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from edge_infer.formats import quantizers_iq4 as q


@pytest.mark.parametrize("weighted", [False, True], ids=["x*x", "weights"])
def test_compiled_search_equals_its_numpy_twin(weighted: bool) -> None:
    rng = np.random.default_rng(4)
    x = rng.standard_t(3, (400, 32)).astype(np.float32)
    x[3] = 0.0  # an all-zero block: scale 0
    x[4, :31] = 0.0  # one value: its sign decides
    x[5] = -x[6]  # mirrored blocks
    w = rng.uniform(0.0, 2.0, x.shape).astype(np.float32) if weighted else x * x
    d = q.fitted_scales(x, w)
    with np.errstate(all="ignore"):
        twin = q.block_scales(x, w)
    assert np.array_equal(d.view(np.uint32), twin.view(np.uint32))
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, np.float32(1)), np.float32(0)).astype(np.float32)
    assert np.array_equal(q.codes_for(x, inv), q.best_index(inv[:, None] * x))
    assert d[3] == 0 and np.all(q.codes_for(x, inv)[3] == 8)  # the code of the value nearest 0
