"""The step-time model: Eq. 1 and Eq. 2 of HyperFlexis and the mixed step (step_time.py, compiled;
its form, fitting and ``Profile`` JSON in latency.py), the roofline that sizes it for hardware
never measured (roofline.py), fitting it to measured steps (fit.py, every fourth point held
out), and the shipped profiles (profiles/).

The shipped profiles for Qwen2.5-7B, Qwen2.5-32B, Llama-3.1-8B and Llama-3-70B are computed, as
no accelerator is at hand: ``t = max(FLOPs / (tp·peak·η_f), bytes / (tp·HBM·η_m)) + all-reduce
time + fixed step overhead`` (seed 002 §3.1.1's max-form), evaluated on HyperFlexis Appendix A's
grid and fitted to the form of Eq. 1/2. The devices (roofline.py's ``HARDWARE``):

    device        peak FP16     HBM                η_f    η_m    step overhead
    ascend-910b   313 TFLOP/s   1.6 TB/s, 64 GB    0.55   0.65   10 ms
    h200          989 TFLOP/s   4.8 TB/s, 141 GB   0.60   0.80   3 ms

The fit's MAPE against the roofline is stored with each profile (1% or less for decode, 6–9% for
prefill, where the max-form's memory floor at small batches is not linear). ``tiny@cpu`` is
measured on the own engine (``hfx profile``), as is any profile a user makes of a real engine
(the own engine's or a vLLM server's).
"""
