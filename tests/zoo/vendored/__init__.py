"""Loss code copied from other libraries (issue 28 item 8): each file holds the source's licence
header, its address and commit, and the functions the zoo calls, verbatim apart from what the
file's own note says was left out (imports of modules the tests do not install). Nothing in the
installed package imports these; ruff leaves them as written (pyproject.toml)."""
