"""The numpy reference model of Clover: the executable specification and test oracle."""
