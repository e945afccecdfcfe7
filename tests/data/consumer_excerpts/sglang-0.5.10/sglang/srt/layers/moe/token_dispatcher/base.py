# An excerpt: the definitions SGLang's findings read (Finding.code); 0.5.10's file has these.
# BaseDispatcher.__init__, lines 264-277 of 0.5.10's sglang/srt/layers/moe/token_dispatcher/base.py
    def __init__(self):
        self.quant_config: Optional[dict] = None

        # Overlap args
        self.overlap_args: Optional[CombineOverlapArgs] = None
        self.meta_overlap_args: Optional[dict] = None

        # Hooks
        self._pre_dispatch_hooks: Optional[_PreDispatchHooks] = None
        self._post_dispatch_hooks: Optional[_PostDispatchHooks] = None
        self._pre_combine_hooks: Optional[_PreCombineHooks] = None
        self._post_combine_hooks: Optional[_PostCombineHooks] = None
        self._original_dispatch_func: Optional[Callable] = None
        self._original_combine_func: Optional[Callable] = None
