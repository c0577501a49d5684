"""Errors a user can cause. The CLI prints them on one line and exits with code 2."""


class UserError(Exception):
    """A mistake in the user's input: a bad option, config, checkpoint, shape or file.

    The message names what is wrong and what would be right.
    """
