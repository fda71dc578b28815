"""Synthetic demo data for the CPU preset and the tests (`klear demo-data`)."""
