"""The command line: `main` builds the parser from each command's module; `options` is the option table that `serve`, `run` and `batch run` share."""
