class Model:
    """Returns its input unchanged (a view: no copy)."""

    def execute(self, inputs):
        return {"OUTPUT0": inputs["INPUT0"]}
