#!/usr/bin/env python3
"""Writes optim/tests/data/optim_reference.txt: torch.optim trajectories in float64.

Run from the repository root with PyTorch 1.13 (Debian's python3-torch):

    /usr/bin/python3 optim/tests/make_reference.py > optim/tests/data/optim_reference.txt

For one fixed parameter vector and one fixed sequence of gradients, every optimizer
configuration below is run with its single-tensor implementation (foreach=False), and
the parameter after every step is written out. gradwire's tests
(optim/tests/functional_test.cc) replay the same gradients through gw::optim::Update and
compare; they read only the data file, never PyTorch.

File format (whitespace separated, one record per line, '#' starts a comment line):

    param <n> <v1> ... <vn>               the initial parameter (once, first)
    grad <k> <v1> ... <vn>                gradient applied at step k = 1, 2, ... (in order)
    case <name> <optimizer> <key>=<value> ...
                                          optimizer is SGD, Adam, AdamW or Adagrad; keys
                                          are the gw::optim config fields; booleans are
                                          0/1; fields not listed keep gradwire's defaults
                                          (which equal PyTorch's, see each case)
    step <k> <v1> ... <vn>                the parameter after step k of the last case

Numbers are printed with repr(), which round-trips float64 exactly.
"""

import sys

import torch

PARAM = [0.5, -1.25, 2.0, 0.0, -0.3, 1.7, -2.2, 0.05]

# Large gradients first and small ones later, so that exp_avg_sq decreases and amsgrad's
# running maximum differs from it; a few exact zeros and sign flips on purpose.
GRADS = [
    [1.0, -2.0, 0.5, 3.0, -0.75, 0.0, 1.5, -0.25],
    [0.8, -1.5, -0.5, 2.5, 0.25, 0.1, -1.0, 0.3],
    [0.1, 0.2, -0.3, 0.4, -0.5, 0.6, -0.7, 0.8],
    [-0.05, 0.02, 0.0, -0.01, 0.03, -0.04, 0.06, -0.07],
    [0.3, -0.1, 0.2, -0.2, 0.0, 0.15, -0.05, 0.01],
]

# (name, torch class, gradwire optimizer name, kwargs). kwargs use gradwire's field names;
# TO_TORCH maps them to torch's constructor arguments.
CASES = [
    ("sgd_plain", torch.optim.SGD, "SGD", dict(lr=0.1)),
    ("sgd_momentum", torch.optim.SGD, "SGD", dict(lr=0.1, momentum=0.9)),
    ("sgd_dampening", torch.optim.SGD, "SGD", dict(lr=0.1, momentum=0.9, dampening=0.3)),
    ("sgd_nesterov", torch.optim.SGD, "SGD", dict(lr=0.1, momentum=0.9, nesterov=True)),
    ("sgd_weight_decay", torch.optim.SGD, "SGD", dict(lr=0.1, weight_decay=0.05)),
    ("sgd_maximize", torch.optim.SGD, "SGD", dict(lr=0.1, maximize=True)),
    ("sgd_all", torch.optim.SGD, "SGD",
     dict(lr=0.05, momentum=0.8, weight_decay=0.1, nesterov=True, maximize=True)),
    ("sgd_momentum_dampening_weight_decay", torch.optim.SGD, "SGD",
     dict(lr=0.07, momentum=0.5, dampening=0.5, weight_decay=0.2)),
    ("adam_plain", torch.optim.Adam, "Adam", dict(lr=0.01)),
    ("adam_weight_decay", torch.optim.Adam, "Adam", dict(lr=0.01, weight_decay=0.1)),
    ("adam_amsgrad", torch.optim.Adam, "Adam", dict(lr=0.01, amsgrad=True)),
    # A short beta2 memory makes exp_avg_sq fall quickly, so the running maximum matters.
    ("adam_amsgrad_beta2", torch.optim.Adam, "Adam", dict(lr=0.01, beta2=0.9, amsgrad=True)),
    ("adam_betas_eps", torch.optim.Adam, "Adam", dict(lr=0.02, beta1=0.5, beta2=0.8, eps=1e-3)),
    ("adam_maximize", torch.optim.Adam, "Adam", dict(lr=0.01, maximize=True)),
    ("adam_all", torch.optim.Adam, "Adam",
     dict(lr=0.03, beta2=0.9, weight_decay=0.05, amsgrad=True, maximize=True)),
    ("adamw_plain", torch.optim.AdamW, "AdamW", dict(lr=0.01)),
    ("adamw_weight_decay", torch.optim.AdamW, "AdamW", dict(lr=0.01, weight_decay=0.3)),
    ("adamw_amsgrad", torch.optim.AdamW, "AdamW", dict(lr=0.01, beta2=0.9, weight_decay=0.1,
                                                       amsgrad=True)),
    ("adamw_maximize", torch.optim.AdamW, "AdamW", dict(lr=0.01, maximize=True)),
    ("adagrad_plain", torch.optim.Adagrad, "Adagrad", dict(lr=0.1)),
    ("adagrad_lr_decay", torch.optim.Adagrad, "Adagrad", dict(lr=0.1, lr_decay=0.5)),
    ("adagrad_initial_accumulator_value", torch.optim.Adagrad, "Adagrad",
     dict(lr=0.1, initial_accumulator_value=0.4)),
    ("adagrad_weight_decay", torch.optim.Adagrad, "Adagrad", dict(lr=0.1, weight_decay=0.2)),
    ("adagrad_maximize", torch.optim.Adagrad, "Adagrad", dict(lr=0.1, maximize=True)),
    ("adagrad_all", torch.optim.Adagrad, "Adagrad",
     dict(lr=0.2, lr_decay=0.1, weight_decay=0.05, initial_accumulator_value=0.1, eps=1e-6,
          maximize=True)),
]


def to_torch(kwargs):
    out = dict(kwargs)
    if "beta1" in out or "beta2" in out:
        out["betas"] = (out.pop("beta1", 0.9), out.pop("beta2", 0.999))
    out["foreach"] = False  # the single-tensor implementation
    return out


def fmt(values):
    return " ".join(repr(float(v)) for v in values)


def fmt_value(v):
    if isinstance(v, bool):
        return "1" if v else "0"
    return repr(float(v))


def main():
    out = sys.stdout
    out.write("# Generated by optim/tests/make_reference.py with torch %s; do not edit.\n"
              % torch.__version__)
    out.write("param %d %s\n" % (len(PARAM), fmt(PARAM)))
    for k, g in enumerate(GRADS, start=1):
        assert len(g) == len(PARAM)
        out.write("grad %d %s\n" % (k, fmt(g)))
    for name, cls, gw_name, kwargs in CASES:
        p = torch.tensor(PARAM, dtype=torch.float64, requires_grad=True)
        opt = cls([p], **to_torch(kwargs))
        keys = " ".join("%s=%s" % (k, fmt_value(v)) for k, v in kwargs.items())
        out.write("case %s %s %s\n" % (name, gw_name, keys))
        for k, g in enumerate(GRADS, start=1):
            p.grad = torch.tensor(g, dtype=torch.float64)
            opt.step()
            out.write("step %d %s\n" % (k, fmt(p.detach().tolist())))


if __name__ == "__main__":
    main()
