"""Reports: tables for the terminal, and plots."""
