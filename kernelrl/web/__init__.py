"""The run page: a small web app over a code database (`kernelrl watch`); see README.md."""
