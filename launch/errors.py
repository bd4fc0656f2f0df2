"""The one exception type the launcher raises for a mistake the user can fix."""


class LaunchError(Exception):
    """A request or command that is wrong before anything leaves the machine.

    The message is one line; the CLI prints it as `error: <message>` and exits 2.
    """
