"""The cost model's elementwise functions, on one step's numbers (Python floats) or a stretch's (numpy arrays).

A replay predicts most steps one at a time (`RooflineCostModel.predict`), a stretch of decode steps at once
(`predict_many`). On a single float a numpy function spends a microsecond or more dispatching, several times its
arithmetic, and a step's prediction made a dozen such calls: on floats these use Python's builtins and `math`
instead (a prediction of Llama-2-7B on an H100 took 7.5 µs, now 2.9). The values agree with numpy's to the last
bit or two (`math.log2` and numpy's own log2 differ by one unit in the last place on about one number in ten
thousand; `Curve` computes numpy's interpolation formula).
"""

import math
from bisect import bisect_right

import numpy as np

ARRAY = np.ndarray  # numpy's scalars (np.float64, np.int64) are numbers: they take Python's path


def maximum(a, b):
    return np.maximum(a, b) if type(a) is ARRAY or type(b) is ARRAY else max(a, b)


def minimum(a, b):
    return np.minimum(a, b) if type(a) is ARRAY or type(b) is ARRAY else min(a, b)


def where(condition, a, b):
    if type(condition) is ARRAY or type(a) is ARRAY or type(b) is ARRAY:
        return np.where(condition, a, b)
    return a if condition else b


def sqrt(x):
    return np.sqrt(x) if type(x) is ARRAY else math.sqrt(x)


def log2(x):
    return np.log2(x) if type(x) is ARRAY else math.log2(x)


class Curve:
    """A piecewise-linear curve through points `(xs, ys)` (xs ascending), held flat beyond its ends: `np.interp`."""

    def __init__(self, xs, ys):
        self.xs, self.ys = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
        self._xs, self._ys = self.xs.tolist(), self.ys.tolist()

    def __call__(self, x):
        if type(x) is ARRAY:
            return np.interp(x, self.xs, self.ys)
        xs, ys = self._xs, self._ys
        j = bisect_right(xs, x) - 1  # the last point at or left of x
        if j < 0:
            return ys[0]
        if j == len(xs) - 1 or xs[j] == x:
            return ys[j]
        slope = (ys[j + 1] - ys[j]) / (xs[j + 1] - xs[j])
        return slope * (x - xs[j]) + ys[j]
