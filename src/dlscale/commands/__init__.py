"""The bodies of the ``dlscale`` subcommands, one module each, and their options.

:mod:`dlscale.commands.flags` (the flags that set config keys) and :mod:`dlscale.commands.options` (the other
options) import no torch: :mod:`dlscale.cli` builds its parser from them and imports a command's module only to
run it.
"""
