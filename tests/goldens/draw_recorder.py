"""The random-draw recorder the golden scripts share (not a gen_* module: make_goldens does not run it).

DrawRecorder stands in for the `torch` module inside a torchvision module while a transform runs
and records every random draw it makes (kind, range, value) in `draws`, for the C++ tests to
replay through gpufeed's DrawSource (tests/recorded_draws.h).
"""


class DrawRecorder:
    """Stands in for `torch` inside the torchvision modules that draw, recording every draw."""

    def __init__(self, real):
        self._real = real
        self.draws = []

    def __getattr__(self, name):
        return getattr(self._real, name)

    def randint(self, *args, **kwargs):
        out = self._real.randint(*args, **kwargs)
        lo, hi = (0, args[0]) if len(args) == 1 or (len(args) == 2 and not isinstance(args[1], int)) else args[:2]
        self.draws.append({"kind": "randint", "lo": int(lo), "hi": int(hi), "value": int(out.reshape(-1)[0])})
        return out

    def rand(self, *args, **kwargs):
        out = self._real.rand(*args, **kwargs)
        self.draws.append({"kind": "uniform", "lo": 0.0, "hi": 1.0, "value": float(out.reshape(-1)[0])})
        return out

    def randperm(self, n, *args, **kwargs):
        out = self._real.randperm(n, *args, **kwargs)
        self.draws.append({"kind": "randperm", "n": int(n), "value": [int(v) for v in out]})
        return out

    def empty(self, *args, **kwargs):
        tensor = self._real.empty(*args, **kwargs)
        rec = self

        class _Draw:
            def uniform_(self, lo, hi):
                tensor.uniform_(lo, hi)
                rec.draws.append({"kind": "uniform", "lo": float(lo), "hi": float(hi),
                                  "value": float(tensor.reshape(-1)[0])})
                return tensor

            def normal_(self):
                tensor.normal_()
                rec.draws.append({"kind": "normal", "value": [float(v) for v in tensor.reshape(-1)]})
                return tensor

        return _Draw()
