from biaslab.console import entry

entry()
