"""Model builders used from the command line (python models/build.py ...) and by the tests."""
