"""What is represented: linear probes on the residual stream with controls, stored directions, and the
features of sparse autoencoders in SAELens' format."""
