"""The parts of the real-model benchmarks (SmolLM2-135M-Instruct and peers on this machine): each measures one figure.

- `matmul_peak`: this machine's 2048x2048x2048 matrix-multiply GFLOP/s in float32 and bfloat16 on N torch threads,
  the peak every other part's FLOP/s is compared with (measured in the same run, on the same threads);
- `trainer_alone`: `PolicyTrainer.train_step` on the real model, alone on the machine.
"""
