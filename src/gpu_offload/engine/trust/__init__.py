"""What the kernel accepts from a cluster it does not trust: safe output decoding and sanitised rich output."""
