"""Helper processes for work a request carries that may crash native code or take seconds: a
serving process (coordinator, worker) hands it to a pool of helpers (`pool.HelperPool`) and
awaits the verdict, so a crash costs that one request (and a helper restart), never the serving
process, and slow work never runs on its event loop. `spec_check.SpecChecker` is what the
services use: limits, a verdict cache, then the pool."""
