#!/usr/bin/python3
"""Produces nn/tests/data/recurrent_reference.txt with PyTorch (Debian python3-torch).

Run once:
  /usr/bin/python3 nn/tests/make_reference_recurrent.py > nn/tests/data/recurrent_reference.txt
Each case builds a module, sets its parameters (in named_parameters() order, parameter p)
to det(shape, 10 + p), runs it on det inputs and backpropagates
  sum(output * det(., 3.5)) + sum(h_n * det(., 4.5)) [+ sum(c_n * det(., 5.5))].
Lines: <case>.<dtype>.<name> <values in row-major order...>; the C++ test
(recurrent_test.cc) rebuilds the same inputs and compares.
"""
import math
import torch


def det(shape, k, dtype):
    n = math.prod(shape)
    return torch.tensor([math.sin(0.37 * i + k) for i in range(n)], dtype=torch.float64) \
        .reshape(shape).to(dtype)


def emit(name, t):
    t = t.detach().reshape(-1)
    print(name, " ".join(repr(float(v)) for v in t.tolist()))


def run(case, cls, kwargs, input_shape, state_shape, dtype, with_states):
    m = cls(**kwargs).to(dtype)
    with torch.no_grad():
        for p, (_, param) in enumerate(m.named_parameters()):
            param.copy_(det(tuple(param.shape), 10 + p, dtype))
    x = det(input_shape, 0.5, dtype).requires_grad_()
    lstm = cls is torch.nn.LSTM
    states = None
    if with_states:
        h0 = (0.5 * det(state_shape, 1.5, dtype)).requires_grad_()
        c0 = det(state_shape, 2.5, dtype).requires_grad_()
        states = (h0, c0) if lstm else h0
    out, hc = m(x, states)
    h_n, c_n = hc if lstm else (hc, None)
    loss = (out * det(tuple(out.shape), 3.5, dtype)).sum() + \
        (h_n * det(tuple(h_n.shape), 4.5, dtype)).sum()
    if lstm:
        loss = loss + (c_n * det(tuple(c_n.shape), 5.5, dtype)).sum()
    loss.backward()
    prefix = f"{case}.{'f64' if dtype == torch.float64 else 'f32'}."
    emit(prefix + "output", out)
    emit(prefix + "h_n", h_n)
    if lstm:
        emit(prefix + "c_n", c_n)
    emit(prefix + "grad.input", x.grad)
    if with_states:
        emit(prefix + "grad.h_0", h0.grad)
        if lstm:
            emit(prefix + "grad.c_0", c0.grad)
    for name, param in m.named_parameters():
        emit(prefix + "grad." + name, param.grad)


for dtype in [torch.float64, torch.float32]:
    # LSTM, 2 layers, batch_first, initial states: N=2, L=5, in=3, H=4.
    run("lstm2", torch.nn.LSTM,
        dict(input_size=3, hidden_size=4, num_layers=2, batch_first=True),
        (2, 5, 3), (2, 2, 4), dtype, True)
    # GRU, 2 layers, time-major, no initial state: L=4, N=3, in=3, H=5.
    run("gru2", torch.nn.GRU, dict(input_size=3, hidden_size=5, num_layers=2),
        (4, 3, 3), None, dtype, False)
    # Unbatched LSTM input [L, in] with states [1, H]: L=6, in=2, H=3.
    run("lstm_unbatched", torch.nn.LSTM, dict(input_size=2, hidden_size=3),
        (6, 2), (1, 3), dtype, True)
    # Bidirectional GRU without bias, 2 layers, batch_first, with h0: N=2, L=3, in=2, H=3.
    run("gru_bi", torch.nn.GRU,
        dict(input_size=2, hidden_size=3, num_layers=2, bias=False, batch_first=True,
             bidirectional=True),
        (2, 3, 2), (4, 2, 3), dtype, True)
