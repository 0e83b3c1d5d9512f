"""The step-time model: Eq. 2 of HyperFlexis (latency.py), the roofline that sizes it for
hardware never measured (roofline.py), fitting it to measured steps (fit.py), and the shipped
profiles (profiles/)."""
