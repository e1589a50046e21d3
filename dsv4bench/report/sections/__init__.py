"""The report's sections: one module each, listed in dsv4bench.report.render.SECTIONS."""
