"""What the four exported resources (`filters.Filter`, `rules.Rule`,
`strategies.Strategy`, `transforms.Transform`) share: the project's class
made from the config once, or the refusal as the WIT's error."""

from componentize_py_types import Err

import laurel


class Resource:
    def __init__(self, function):
        self.function = function

    @classmethod
    def create(cls, config):
        function, refused = laurel.create(config)
        if refused is not None:
            raise Err(refused)
        return cls(function)
