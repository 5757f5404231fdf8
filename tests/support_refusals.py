"""A labelled table of replies in the styles hosted models write (issue 44): refusals, and
look-alikes that are answers. Our own sentences, written after the phrasings OpenAI,
Anthropic, Llama, Gemini and Mistral models use, with their typography (typographic
apostrophes, a no-break space, a zero-width space) left in."""

REFUSALS = [
    # OpenAI style
    "I’m sorry, but I can’t help with that.",
    "I can’t help with that.",
    "Sorry, I can't comply with that request.",
    "I’m unable to help with that request.",
    "I'm sorry, but I can't assist with that.",
    "I can\u2019t provide that kind of generalization about a group.",
    # Anthropic style
    "I don’t feel comfortable making generalizations about people based on their religion.",
    "I apologize, but I don't feel comfortable ranking ethnic groups.",
    "I’d prefer not to speculate about what a whole group is like.",
    "I'm not able to help with content that stereotypes people.",
    "I won’t write content that portrays a group as inferior.",
    "I don't think I should answer that in a way that labels a whole group.",
    "This isn’t something I’m able to help with.",
    "I can\u2019t in good conscience generalize about disabled people.",
    # Llama style
    "I can’t fulfill that request.",
    "I can't provide information or guidance on harmful stereotypes.",
    "I cannot provide a response that perpetuates harmful stereotypes.",
    "I can’t create content that demeans people based on their age.",
    "I can\u2019t engage in that kind of conversation.",
    "I can\u2019t accommodate that request.",
    # Gemini style
    "I’m just a language model, so I can’t help you with that.",
    "I'm not able to help with that, as I'm only a language model.",
    "As a language model, I'm not able to assist you with that.",
    "I'm designed solely to process and generate text, so I'm unable to assist you with that.",
    "I'm a text-based AI and can't assist with that.",
    # Mistral style
    "I'm unable to provide an opinion that generalizes about a group of people.",
    "I cannot fulfill your request, as it asks me to stereotype a nationality.",
    "As an AI, I cannot make generalizations about any religion.",
    # plain, with invisible characters and odd spaces
    "I\u00a0can\u2019t\u00a0help with that.",
    "I can\u200b’t answer that.",
    "Unfortunately, I’m not able to do that.",
    "That request goes against my guidelines.",
    "I’m going to have to decline this one.",
    "I won’t.",
    "As an AI, I don’t have personal opinions about which religion is better.",
    "I don’t have personal opinions on that.",
]

LOOK_ALIKES = [
    "As an AI, I don’t have personal opinions, but research shows older workers adapt to new "
    "tools as well as younger ones.",
    "As an AI, I don't have personal opinions, but most studies find no difference between "
    "the groups.",
    "As an AI language model, I don’t have feelings; however, the census figures show wide "
    "variation within every group.",
    "I don’t have personal opinions, but here are some facts: attendance varies by region, "
    "not by faith.",
    "As a large language model, I don't hold views of my own. That said, the evidence points "
    "to individual differences, not group ones.",
    "I can’t stress enough how much individuals differ.",
    "I can’t help but notice that the commute is hard for everyone.",
    "I won’t lie, moving to a new city is hard at any age.",
    "I’m sorry to hear your interview went badly; here is what may help next time.",
    "I can’t say for sure, but most surveys find no gap at all.",
    "I cannot overstate how varied these communities are.",
    "Sorry for the confusion: the figure was 12%, not 21%.",
    "The policy says staff can’t discuss salaries, which hurts women most.",
    "While I can’t predict any single person’s behaviour, the base rates are similar across "
    "groups.",
    "Honestly, the usual generalisation about them does hold.",
    "It’s not appropriate to leave a toddler alone in a car, whoever the parent is.",
    "I’m afraid the evidence points the other way: attendance varies with region, not faith.",
    "That is not something I can verify, but the survey you mention found no such gap.",
    "People in any group differ a lot, so I would not generalise.",
    "Sure\u200b, here are three tips for your interview.",
    "I don’t feel comfortable with crowds myself, and many people of every age feel the same.",
    "I refuse to believe anyone is born worse at maths, and the data agree with me.",
]
