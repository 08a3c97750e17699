"""`mindmotor up`: the whole platform as child processes of one command."""
