"""The engine and the step-time model: fidelity of the simulator to the real engine, step noise,
scale-out weight paths."""
