"""A Megatron entry script whose extra flag is added by a statement that binds nothing: a first
pass that runs only the statements binding the entry call's arguments misses it. Its ranks
print a line; the check reads the entry call, which the ranks do not make."""

from megatron.training import pretrain

FLAGS = []


def add_flags(parser):
    for flag in FLAGS:
        parser.add_argument(flag, type=int)
    return parser


FLAGS.append("--my-flag")

if __name__ == "__main__":
    print("ranks started")
    if False:
        pretrain(None, None, None, None, extra_args_provider=add_flags,
                 args_defaults={"tokenizer_type": "NullTokenizer"})
