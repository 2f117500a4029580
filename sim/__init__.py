"""What-if simulator: the real engine and policies on a cost-model clock (floor 5)."""
