"""The peers' formats: this suite's runs written in them, their definitions read as scenarios."""
