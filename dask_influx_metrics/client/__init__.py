"""Runs where the user is: :class:`.monitor.Monitor`, reading back (:mod:`.query` ->
:mod:`.tables` / :mod:`.peaks` / :mod:`.summary`), CSV files, plots and the command line."""
